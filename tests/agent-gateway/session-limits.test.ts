import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { DEFAULT_SESSION_LIMITS, type SessionLimits } from "../../shared/agent-loop/session-limits.ts";
import { SingleTurnAgentLoop } from "../../shared/agent-loop/single-turn-agent.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { createAgentExecutor } from "../../shared/rollout/executor.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import type { AgentLoopKwargs } from "../../shared/agent-loop/agent-loop.ts";
import type { AgentLoopOutput, SamplingParams } from "../../shared/schema/index.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, SP } from "../agent-loop/helpers.ts";
import { depsFor, ROWS } from "../session/fixtures.ts";
import { examplePolicy } from "../helpers/examples.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 item 4 / audit S5: a session has a cap on outputs and on engine calls (config `limits`);
// past it the session fails visibly; self-reported rewards stay inside limits.reward_min/max.

const script = examplePolicy();
const TOKEN = "tok_0123456789abcdef0123";
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

function setup(limits: Partial<SessionLimits>) {
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(new SimEngine({ tokenizer: tok, script })), maxModelLen: 4096, limits: { ...DEFAULT_SESSION_LIMITS, ...limits } });
  const app = createAgentGatewayApp({ gateway: gw });
  const chat = (i: number) =>
    app.request("/v1/sessions/u0_0_0/openai/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ model: "qwen3", messages: [{ role: "user", content: `edit ${i}` }] }),
    });
  const finish = (body: unknown) => app.request("/v1/sessions/u0_0_0/finish", { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` }, body: JSON.stringify(body) });
  const create = () =>
    gw.create({ v: 1, key: "u0_0_0", uid: "u0", session_id: 0, token: TOKEN, created_ms: Date.now(), deadline_ms: Date.now() + 60_000, sampling_params: SP, rollout: config(), tools: [], messages: [{ role: "user", content: "hi" }] });
  return { gw, app, chat, finish, create };
}

describe("agent gateway: per-session caps", () => {
  test("the audit's repro: calls past limits.max_outputs_per_session are 409 session_limit and the session fails", async () => {
    const s = setup({ maxOutputs: 3 });
    await s.create();
    for (let i = 0; i < 3; i++) expect((await s.chat(i)).status).toBe(200);
    const over = await s.chat(3);
    expect(over.status).toBe(409);
    expect(await over.json()).toEqual({
      error: { code: "session_limit", message: "session_limit: session 'u0_0_0' reached limits.max_outputs_per_session (3 outputs); the session fails", field: "limits.max_outputs_per_session", type: "invalid_request_error", param: "limits.max_outputs_per_session" },
    });
    const st = (await s.gw.get("u0_0_0"))!;
    expect([st.outputs.length, st.finish?.by, st.finish?.metadata?.error]).toEqual([3, "failed", "session_limit: session 'u0_0_0' reached limits.max_outputs_per_session (3 outputs); the session fails"]);
    // Closed for good: later calls and the agent's finish are refused.
    expect(((await (await s.chat(4)).json()) as { error: { code: string } }).error.code).toBe("session_closed");
    expect((await s.finish({ reward: 1 })).status).toBe(409);
  });

  test("limits.max_engine_calls_per_session caps sampling calls", async () => {
    const s = setup({ maxEngineCalls: 2 });
    await s.create();
    expect([(await s.chat(0)).status, (await s.chat(1)).status]).toEqual([200, 200]);
    const over = await s.chat(2);
    expect([over.status, ((await over.json()) as { error: { field: string } }).error.field]).toEqual([409, "limits.max_engine_calls_per_session"]);
    expect((await s.gw.get("u0_0_0"))!.finish?.by).toBe("failed");
  });

  test("a reward outside limits.reward_min/reward_max is a 400 naming reward; the session stays open for a valid one", async () => {
    const s = setup({ rewardMin: 0, rewardMax: 1 });
    await s.create();
    expect((await s.chat(0)).status).toBe(200);
    for (const reward of [1.5, -0.1]) {
      const bad = await s.finish({ reward });
      expect([bad.status, ((await bad.json()) as { error: { field: string } }).error.field]).toEqual([400, "reward"]);
    }
    expect((await s.gw.get("u0_0_0"))!.finish).toBeNull();
    expect((await s.finish({ reward: 1 })).status).toBe(200);
    // A task's answer is checked the same way (it fails the trajectory).
    await expect(s.gw.finish("u0_0_0", { by: "task", reward: 7 })).rejects.toMatchObject({ status: 400, field: "reward" });
  });

  test("config: limits keys with their documented defaults; reward_min above reward_max is refused", () => {
    expect(parseAppConfig({}).limits).toEqual({ max_outputs_per_session: 128, max_engine_calls_per_session: 1024, reward_min: null, reward_max: null, max_prompt_length: 131072, max_response_length: 131072, max_prompt_chars: 8388608, max_event_loop_lag_ms: 250 });
    expect(() => parseAppConfig({ limits: { reward_min: 2, reward_max: 1 } })).toThrow("config limits.reward_min: limits.reward_min must be <= limits.reward_max (in config)");
  });
});

/** A custom loop that reports `copies` outputs of one single-turn run (as a step-wise loop would). */
class ManyOutputs extends SingleTurnAgentLoop {
  static copies = 5;
  override async run(sp: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput> {
    const one = await super.run(sp, kwargs);
    return Array.from({ length: ManyOutputs.copies }, () => one) as unknown as AgentLoopOutput;
  }
}

describe("custom loops: the executor enforces the same caps", () => {
  let tools: ToolServer;
  beforeAll(() => {
    tools = startToolServer({ port: 0 });
  });
  afterAll(() => tools.stop());

  async function runOne(limits: Partial<SessionLimits>, row: Record<string, unknown>) {
    const { deps } = await depsFor(tools.url);
    deps.registry.register("many_outputs", ManyOutputs);
    const service = new RolloutService({
      config: parseAppConfig({ rollout: { n: 1, max_model_len: 4096 } }),
      store: new MemoryTransferQueue(),
      executorFor: (r, b) => createAgentExecutor({ ...deps, sessionLimits: { ...DEFAULT_SESSION_LIMITS, ...limits } }, r, b),
    });
    const { batch_id } = await service.accept({ rows: [row] } as never);
    const run = service.batch(batch_id);
    await run.run();
    return { records: run.records() };
  }

  test("a loop returning more outputs than limits.max_outputs_per_session fails its session (one error record)", async () => {
    const { records } = await runOne({ maxOutputs: 2 }, { ...ROWS[0], agent_name: "many_outputs", uid: "many" });
    expect(records.map((r) => [r.key, r.error])).toEqual([["many_0_0", "SessionLimitError: session_limit: session 'many_0_0' reached limits.max_outputs_per_session (2 outputs); the session fails"]]);
    const ok = await runOne({ maxOutputs: 5 }, { ...ROWS[0], agent_name: "many_outputs", uid: "many" });
    expect(ok.records.map((r) => [r.key, r.error])).toEqual([0, 1, 2, 3, 4].map((i) => [`many_0_${i}`, null]));
  });

  test("a tool loop past limits.max_engine_calls_per_session fails with the limit named (row 3 needs three calls)", async () => {
    const { records } = await runOne({ maxEngineCalls: 2 }, { ...ROWS[3], uid: "film" });
    expect(records.map((r) => [r.key, r.error])).toEqual([["film_0_0", "SessionLimitError: session_limit: session 'film_0_0' reached limits.max_engine_calls_per_session (2 engine calls); the session fails"]]);
    const ok = await runOne({ maxEngineCalls: 3 }, { ...ROWS[3], uid: "film" });
    expect(ok.records.map((r) => [r.key, r.error, r.num_turns > 0])).toEqual([["film_0_0", null, true]]);
  });
});


describe("the audit's S5 repro end to end: an agent past the cap cannot fill its group", () => {
  test("n = 2, the agent of session 0 makes 10 chat calls with limits.max_outputs_per_session 3: its session fails, the group holds no more than the caps allow", async () => {
    const { writeFileSync, mkdtempSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { Hono } = await import("hono");
    const { buildRuntime } = await import("../../infra/cli/runtime.ts");
    const { createRolloutsApp } = await import("../../functions/rollouts.ts");
    const statuses: number[][] = [[], []];
    const agentDone: Promise<void>[] = [];
    const agent = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: async (req) => {
        const task = (await req.json()) as { key: string; session_id: number; base_url: string; api_key: string; finish_url: string };
        const headers = { "content-type": "application/json", authorization: `Bearer ${task.api_key}` };
        agentDone.push(
          (async () => {
            // Session 0 behaves as the audit's agent (a new conversation per call); session 1 makes one call.
            const calls = task.session_id === 0 ? 10 : 1;
            for (let i = 0; i < calls; i++) {
              const r = await fetch(`${task.base_url}/chat/completions`, { method: "POST", headers, body: JSON.stringify({ model: "qwen3", messages: [{ role: "user", content: `edit ${i}` }] }) });
              statuses[task.session_id]!.push(r.status);
              await r.body?.cancel();
            }
            const f = await fetch(task.finish_url, { method: "POST", headers, body: JSON.stringify({ reward: 1 }) });
            statuses[task.session_id]!.push(f.status);
          })(),
        );
        return new Response(null, { status: 202 });
      },
    });
    const dir = mkdtempSync(`${tmpdir()}/s5-`);
    writeFileSync(`${dir}/config.json`, JSON.stringify({ limits: { max_outputs_per_session: 3 } }));
    const rt = await buildRuntime({ config: `${dir}/config.json`, n: 2, seed: 7, agent: `http://127.0.0.1:${agent.port}/tasks` });
    const app = new Hono();
    app.route("/", createAgentGatewayApp({ gateway: rt.agentGateway }));
    app.route("/", createRolloutsApp({ service: rt.service }));
    const api = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
    rt.setPublicUrl(`http://127.0.0.1:${api.port}`);
    try {
      const res = await app.request("/v1/rollouts", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ rows: [{ uid: "s5grp", agent_name: "openai_agent", prompt: [{ role: "user", content: "hello" }] }], config: { rollout: { n: 2, response_length: 64, multi_turn: { max_assistant_turns: 1 } } } }),
      });
      expect(res.status).toBe(202);
      const { batch_id } = (await res.json()) as { batch_id: string };
      await rt.service.batch(batch_id).run();
      await Promise.all(agentDone);
      // Session 0: three outputs, then 409 session_limit; the session is failed, so the rest and the finish are 409 too.
      expect(statuses[0]).toEqual([200, 200, 200, 409, 409, 409, 409, 409, 409, 409, 409]);
      expect(statuses[1]).toEqual([200, 200]);
      const recs = rt.service.batch(batch_id).records().map((r) => [r.key, r.error, r.reward_score]);
      expect(recs.sort()).toEqual([
        ["s5grp_0_0", "AgentWebhookError: session_limit: session 's5grp_0_0' reached limits.max_outputs_per_session (3 outputs); the session fails", null],
        ["s5grp_1_0", null, 1],
      ]);
      expect(await rt.store.groupStatus("s5grp")).toMatchObject({ expected: 2, finished: 2, records: 2, failed: 1, complete: true });
    } finally {
      await api.stop(true);
      await agent.stop(true);
      await rt.close();
    }
  }, HANG_MS);
});
