import { describe, expect, test } from "bun:test";
import { finalTokenVersions, pushVersion, recordTurnVersions, type TokenVersions } from "../../shared/agent-loop/agent-loop.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { restoreToolAgentFields, saveToolAgentFields, SessionInput, ToolAgentFields } from "../../shared/session/checkpoint.ts";
import type { TokenOutput } from "../../shared/schema/index.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { rolloutConfig } from "../session/fixtures.ts";

const out = (n: number, extra: Record<string, unknown>): TokenOutput => ({ token_ids: Array.from({ length: n }, (_, i) => 100 + i), finish_reason: "stop", num_preempted: 0, extra_fields: extra });

describe("token_versions segments", () => {
  test("turns merge by version; a resumed turn's segments are offset; observations stay in the action's segment; cut to the response", () => {
    const segs: TokenVersions = [];
    recordTurnVersions(segs, 0, out(5, { model_version: "v1" })); // turn 1: [0,5)
    recordTurnVersions(segs, 9, out(6, { model_version: "v1" })); // observation [5,9), turn 2: [9,15)
    expect(segs).toEqual([[0, "v1"]]);
    // Turn 3 at 20, resumed after an abort: 3 tokens under v1, then v2.
    recordTurnVersions(segs, 20, out(7, { model_version: "v2", token_versions: [[0, "v1"], [3, "v2"]] }));
    expect(segs).toEqual([[0, "v1"], [23, "v2"]]);
    recordTurnVersions(segs, 30, out(2, { model_version: "v2" }));
    expect(finalTokenVersions(segs, 32)).toEqual([[0, "v1"], [23, "v2"]]);
    // The builder cut the response before the v2 tokens.
    expect(finalTokenVersions(segs, 23)).toEqual([[0, "v1"]]);
    // Empty turns add nothing; unknown versions only: no field.
    const none: TokenVersions = [];
    recordTurnVersions(none, 0, out(0, { model_version: "v9" }));
    recordTurnVersions(none, 0, out(4, {}));
    expect(none).toEqual([[0, null]]);
    expect(finalTokenVersions(none, 4)).toBeUndefined();
    // A zero-length segment is replaced, and a replacement equal to the one before merges.
    const z: TokenVersions = [[0, "a"], [4, "b"]];
    pushVersion(z, 4, "a");
    expect(z).toEqual([[0, "a"]]);
  });

  test("durable sessions checkpoint and restore them (tool_agent's fields, JSON round trip)", async () => {
    const tok = await defaultTokenizer();
    const rollout = rolloutConfig();
    const loop = new ToolAgentLoop({ tokenizer: tok, client: { generate: async () => out(1, {}) }, config: rollout });
    const input = SessionInput.parse({ key: "u0_0_0", agent_name: "tool_agent", sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true }, kwargs: { uid: "u0", session_id: 0, prompt: [{ role: "user", content: "hi" }] }, rollout });
    const d = loop.initData(input.sampling_params, input.kwargs as never);
    d.tokenVersions = [[0, "v1"], [23, 7]];
    const saved = ToolAgentFields.parse(JSON.parse(JSON.stringify(saveToolAgentFields(d))));
    expect(saved.token_versions).toEqual([[0, "v1"], [23, 7]]);
    expect(restoreToolAgentFields(loop, saved, input).tokenVersions).toEqual([[0, "v1"], [23, 7]]);
    // A checkpoint written before the field existed restores to no segments.
    const { token_versions: _, ...old } = saved;
    expect(restoreToolAgentFields(loop, ToolAgentFields.parse(old), input).tokenVersions).toEqual([]);
  });
});

describe("/v1/engine/* on the API", () => {
  test("bearer auth like /v1; a bad mode is a 400 naming the field; gate state; 501 without engine control", async () => {
    const { createRolloutsApp } = await import("../../functions/rollouts.ts");
    const { EngineControl, MemoryEngineGate } = await import("../../shared/inference/engine-control.ts");
    const { createSimEngineApp } = await import("../../infra/sim-engine/app.ts");
    const { SimEngine } = await import("../../infra/sim-engine/sim-engine.ts");
    const { RolloutService } = await import("../../shared/service/rollout-service.ts");
    const { MemoryTransferQueue } = await import("../../shared/store/memory-transfer-queue.ts");
    const { parseAppConfig } = await import("../../shared/config/app-config.ts");
    const tok = await defaultTokenizer();
    const sim = new SimEngine({ tokenizer: tok });
    const simApp = createSimEngineApp(sim);
    const gate = new MemoryEngineGate();
    const engine = new EngineControl({ gate, format: "vllm", replicas: () => [{ url: "http://sim.local", fetch: async (i, init) => simApp.fetch(new Request(i, init)) }] });
    const service = new RolloutService({ config: parseAppConfig({}, "test"), store: new MemoryTransferQueue(), executorFor: () => { throw new Error("unused"); } });
    const app = createRolloutsApp({ service, engine, apiToken: "s3cret" });
    const h = { "content-type": "application/json", authorization: "Bearer s3cret" };
    expect((await app.request("/v1/engine/pause", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).status).toBe(401);
    const bad = await app.request("/v1/engine/pause", { method: "POST", headers: h, body: JSON.stringify({ mode: "in_place" }) });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { field: string } }).error.field).toBe("mode");
    // keep + clear_cache: refused at the boundary (frozen requests hold their KV; SGLang's flush would fail), nothing paused.
    const both = await app.request("/v1/engine/pause", { method: "POST", headers: h, body: JSON.stringify({ mode: "keep", clear_cache: true }) });
    expect(both.status).toBe(400);
    expect(((await both.json()) as { error: { field: string } }).error.field).toBe("clear_cache");
    expect(sim.pauses).toEqual([]);
    const p = await app.request("/v1/engine/pause", { method: "POST", headers: h, body: JSON.stringify({ mode: "keep" }) });
    expect(await p.json()).toEqual({ paused: true, mode: "keep", since_ms: expect.any(Number), epoch: 1, inflight: 0, replicas: [{ url: "http://sim.local", ok: true, status: 200 }] });
    expect(sim.pauses.map((x) => [x.mode, x.clear_cache])).toEqual([["keep", false]]);
    const st = await app.request("/v1/engine/status", { headers: h });
    expect(await st.json()).toMatchObject({ paused: true, replicas: [{ paused: true }] });
    // A call while paused waits for the resume.
    let ran = false;
    const call = gate.run(async () => (ran = true));
    await Bun.sleep(10);
    expect(ran).toBe(false);
    const r = await app.request("/v1/engine/resume", { method: "POST", headers: h });
    // (the held call went as soon as the gate opened)
    expect(await r.json()).toEqual({ paused: false, mode: null, since_ms: null, epoch: 2, inflight: expect.any(Number), replicas: [{ url: "http://sim.local", ok: true, status: 200 }] });
    await call;
    expect(ran).toBe(true);
    expect(await (await app.request("/v1/engine/status", { headers: h })).json()).toMatchObject({ paused: false, inflight: 0, replicas: [{ paused: false }] });
    expect(sim.paused).toBe(false);
    const none = createRolloutsApp({ service });
    expect((await none.request("/v1/engine/status")).status).toBe(501);
  });
});
