import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";

// The weight-update protocol end to end: trajectories in flight through the in-process runtime
// against one simulated replica (vLLM or SGLang wire format, token-by-token decode latency);
// the trainer's step pause → model-version (→ SGLang weight version) → resume through the API.

const ROW_COUNT = 6;
const N = 2;
const rows = Array.from({ length: ROW_COUNT }, (_, i) => ({ ...ROWS[i]!, uid: `pause${i}` }));
const LATENCY = { prefill_ms_per_token: 0, decode_ms_per_token: 3 };
const json = { "content-type": "application/json" };

let tok: ChatTokenizer;
let reference: Map<string, TrajectoryRecord>;

async function runtimeFor(sim: RunningSimEngine, format: "vllm" | "sglang"): Promise<{ rt: Runtime; app: ReturnType<typeof createRolloutsApp> }> {
  const rt = await buildRuntime({ engine: sim.urls[0]!, engineFormat: format, n: N, seed: 7, maxModelLen: 4096 });
  return { rt, app: createRolloutsApp({ service: rt.service, engine: rt.engine }) };
}

const post = (app: ReturnType<typeof createRolloutsApp>, path: string, body?: unknown) =>
  app.request(path, { method: "POST", headers: json, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });

beforeAll(async () => {
  tok = await defaultTokenizer();
  // The reference: the same batch, uninterrupted.
  const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
  const { rt, app } = await runtimeFor(sim, "vllm");
  expect((await post(app, "/v1/model-version", { version: "v1" })).status).toBe(200);
  const b = rt.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
  await b.run.run();
  reference = new Map(b.run.records().map((r) => [r.key, r]));
  await rt.close();
  await sim.stop();
  expect(reference.size).toBe(ROW_COUNT * N);
  for (const r of reference.values()) {
    expect(r.error).toBeNull();
    expect(r.extra_fields.token_versions).toEqual([[0, "v1"]]);
  }
});

/**
 * Where the first token generated under the new weights starts in each
 * trajectory's response (undefined: none), from the replica's request log:
 * a request's tokens begin at `prompt_tokens − prompt length` of the response.
 */
function boundaries(engine: SimEngine, records: readonly TrajectoryRecord[], isNew: (l: SimEngine["requests"][number]) => boolean): Map<string, number | undefined> {
  const out = new Map<string, number | undefined>();
  for (const r of records) {
    const first = engine.requests.find((l) => l.routing_key === r.key && isNew(l));
    out.set(r.key, first ? first.prompt_tokens - r.prompt_ids.length : undefined);
  }
  return out;
}

function expectedVersions(b: number | undefined): unknown {
  if (b === undefined) return [[0, "v1"]];
  if (b === 0) return [[0, "v2"]];
  return [
    [0, "v1"],
    [b, "v2"],
  ];
}

const CASES: Array<{ format: "vllm" | "sglang"; mode: "abort" | "wait" | "keep"; engineMode: string }> = [
  { format: "vllm", mode: "abort", engineMode: "abort" },
  { format: "vllm", mode: "wait", engineMode: "wait" },
  { format: "vllm", mode: "keep", engineMode: "keep" },
  { format: "sglang", mode: "abort", engineMode: "abort" },
  { format: "sglang", mode: "wait", engineMode: "in_place" },
  { format: "sglang", mode: "keep", engineMode: "in_place" },
];

describe("POST /v1/engine/pause → model-version → resume with trajectories in flight", () => {
  let sim: RunningSimEngine | undefined;
  let rt: Runtime | undefined;
  afterAll(async () => {
    await rt?.close();
    await sim?.stop();
  });

  for (const c of CASES) {
    test(`${c.format} ${c.mode} (engine mode ${c.engineMode}): tokens equal the uninterrupted run, no request during the pause, token_versions exact`, async () => {
      sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
      const engine = sim.replicas[0]!.engine;
      if (c.format === "sglang") engine.weightVersion = "v1";
      const built = await runtimeFor(sim, c.format);
      rt = built.rt;
      const app = built.app;
      expect((await post(app, "/v1/model-version", { version: "v1" })).status).toBe(200);
      const b = rt.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
      const done = b.run.run();

      // Pause while requests are mid-generation: at least two decoding, each with tokens out and 20 more to come
      // (the engine's per-request progress, not the clock or the total so far).
      const midDecode = () => engine.requests.filter((l) => l.ended_ms === undefined && (l.decoded ?? 0) >= 1 && (l.planned ?? 0) - (l.decoded ?? 0) >= 20).length;
      const t0 = Date.now();
      while (Date.now() - t0 < 60_000 && !(engine.stats.inflight >= 3 && midDecode() >= 2)) await Bun.sleep(1);
      expect(engine.stats.inflight).toBeGreaterThan(0);
      const paused = await post(app, "/v1/engine/pause", { mode: c.mode, clear_cache: false });
      const pauseReturned = Date.now();
      expect(paused.status).toBe(200);
      const ps = (await paused.json()) as { paused: boolean; mode: string; since_ms: number; replicas: { url: string; ok: boolean }[] };
      expect(ps).toMatchObject({ paused: true, mode: c.mode, replicas: [{ url: sim.urls[0], ok: true }] });
      expect(engine.paused).toBe(true);
      expect(engine.pauses.map((p) => p.mode)).toEqual([c.engineMode as never]);
      const status = (await (await app.request("/v1/engine/status")).json()) as { paused: boolean; replicas: { paused?: boolean | null }[] };
      expect(status.paused).toBe(true);
      expect(status.replicas[0]!.paused).toBe(c.format === "vllm" ? true : null);
      if (c.mode !== "keep") expect(engine.stats.inflight).toBe(0); // abort: answered; wait: drained

      await Bun.sleep(150); // the "weight update"
      expect((await post(app, "/v1/model-version", { version: "v2" })).status).toBe(200);
      if (c.format === "sglang") {
        // What a trainer's update_weights_from_* {weight_version} does; SGLang's own route. Its abort_all_requests
        // defaults to true (every request aborted, frozen ones too): a trainer that keeps requests passes false.
        const r = await fetch(`${sim.urls[0]}/update_weight_version`, { method: "POST", headers: json, body: JSON.stringify({ new_version: "v2", abort_all_requests: false }) });
        expect(r.status).toBe(200);
      }
      const resumed = await post(app, "/v1/engine/resume");
      expect(resumed.status).toBe(200);
      expect(((await resumed.json()) as { paused: boolean }).paused).toBe(false);
      expect(engine.paused).toBe(false);
      await done;

      const pause = engine.pauses[0]!;
      expect(pause.resumed_ms).not.toBeNull();
      // The pause begins when edgeloop closes its gate (before the engines pause: for SGLang `wait`,
      // after edgeloop's own calls drained) and ends when the engines resumed.
      const start = ps.since_ms;
      expect(start).toBeLessThanOrEqual(pause.paused_ms);
      // No engine request reached the paused engine. (A call the gate admitted before it closed may still reach
      // the engine between the gate's close and the engine's pause — under load that gap is hundreds of ms — and
      // runs, or is aborted, under the old weights.)
      // Known race (issue note): a call sent just before the gate closed can still reach the engine after the
      // engine's pause (another connection); it is then held and runs after the resume. Nothing runs on a paused
      // engine; such a late call's vLLM version stamp (read before the close) is not exact, so it is listed.
      // Arrival order, not the millisecond: a request that arrived in the pause's millisecond but before it is not "during".
      const during = engine.requests.filter((l) => l.seq! > pause.after_seq && l.received_ms! < pause.resumed_ms!);
      expect(during.filter((l) => l.started_ms! < pause.resumed_ms!)).toEqual([]);
      const late = new Set(during.map((l) => l.routing_key));
      // The mode did what it says to the requests in flight.
      const spanning = engine.requests.filter((l) => l.started_ms! < start && l.ended_ms! >= start);
      expect(spanning.length).toBeGreaterThan(0);
      if (c.mode === "abort") {
        // None outlives the pause call (those in their last step at the pause may finish normally).
        expect(spanning.every((l) => l.ended_ms! <= pauseReturned)).toBe(true);
        expect(spanning.some((l) => l.finish_reason === "abort" && l.completion_tokens! > 0)).toBe(true);
      } else if (c.mode === "wait") {
        // Drained: every one finished normally before the pause call returned.
        expect(spanning.every((l) => l.finish_reason !== "abort" && l.ended_ms! <= pauseReturned)).toBe(true);
      } else {
        // Frozen (or in their last step): none aborted; those frozen finished after the resume.
        expect(spanning.every((l) => l.finish_reason !== "abort" && (l.ended_ms! <= pauseReturned || l.ended_ms! >= pause.resumed_ms!))).toBe(true);
        expect(spanning.some((l) => l.ended_ms! >= pause.resumed_ms!)).toBe(true);
      }

      const records = b.run.records();
      expect(records.length).toBe(ROW_COUNT * N);
      // vLLM reports no version: a call's tokens carry the version current when it was sent;
      // SGLang's replies carry meta_info.weight_version (a frozen request resumed under v2 reports v2).
      const bounds = boundaries(engine, records, c.format === "vllm" ? (l) => l.started_ms! >= pause.resumed_ms! : (l) => l.weight_version === "v2");
      let twoSegmentTurns = 0;
      for (const r of records) {
        const ref = reference.get(r.key)!;
        expect(r.error).toBeNull();
        expect(r.response_ids).toEqual(ref.response_ids);
        expect(r.response_mask).toEqual(ref.response_mask);
        if (!(c.format === "vllm" && late.has(r.key))) expect(r.extra_fields.token_versions).toEqual(expectedVersions(bounds.get(r.key)));
        const b0 = bounds.get(r.key);
        if (c.mode === "abort") {
          // Kept partial tokens keep their log-probs; a resumed turn's rest is sampled anew.
          const cut = b0 ?? r.response_ids.length;
          expect(r.rollout_log_probs!.slice(0, cut)).toEqual(ref.rollout_log_probs!.slice(0, cut));
          // A turn resumed across the update: its resumed request's prompt ends inside an assistant turn.
          if (b0 !== undefined && b0 > 0 && r.response_mask[b0 - 1] === 1) twoSegmentTurns++;
        } else {
          expect(r.rollout_log_probs).toEqual(ref.rollout_log_probs);
        }
      }
      if (c.mode === "abort") expect(twoSegmentTurns).toBeGreaterThan(0);
      await rt.close();
      rt = undefined;
      await sim.stop();
      sim = undefined;
    }, HANG_MS); // a bound for a hang only
  }
});

describe("sim engine pause endpoints", () => {
  test("vLLM /pause validates mode and clear_cache; /is_paused; SGLang /pause_generation validates mode; /get_weight_version", async () => {
    const s = await startSimEngine({ tokenizer: tok });
    try {
      const u = s.urls[0]!;
      expect((await fetch(`${u}/pause?mode=later`, { method: "POST" })).status).toBe(400);
      expect(await (await fetch(`${u}/pause?mode=keep&clear_cache=maybe`, { method: "POST" })).json()).toEqual({
        error: { message: "clear_cache: must be a boolean; got 'maybe'", type: "BadRequestError", param: "clear_cache", code: 400 },
      });
      expect(await (await fetch(`${u}/is_paused`)).json()).toEqual({ is_paused: false });
      expect(await (await fetch(`${u}/pause?mode=keep&clear_cache=true`, { method: "POST" })).json()).toEqual({ status: "paused" });
      expect(await (await fetch(`${u}/is_paused`)).json()).toEqual({ is_paused: true });
      expect(s.replicas[0]!.engine.pauses[0]).toMatchObject({ mode: "keep", clear_cache: true, resumed_ms: null });
      expect(await (await fetch(`${u}/resume`, { method: "POST" })).json()).toEqual({ status: "resumed" });
      expect(await (await fetch(`${u}/is_paused`)).json()).toEqual({ is_paused: false });
      const bad = await fetch(`${u}/pause_generation`, { method: "POST", headers: json, body: JSON.stringify({ mode: "keep" }) });
      expect(bad.status).toBe(400);
      expect(await bad.json()).toEqual({ error: { message: 'mode: must be one of abort, in_place, retract; got "keep"' } });
      expect(await (await fetch(`${u}/get_weight_version`)).json()).toEqual({ weight_version: "default" });
      await fetch(`${u}/update_weight_version`, { method: "POST", headers: json, body: JSON.stringify({ new_version: "step-3" }) });
      const gen = await fetch(`${u}/generate`, { method: "POST", headers: json, body: JSON.stringify({ input_ids: tok.encode("hi"), sampling_params: { max_new_tokens: 4 } }) });
      expect(((await gen.json()) as { meta_info: { weight_version: string } }).meta_info.weight_version).toBe("step-3");
    } finally {
      await s.stop();
    }
  });

  test("retract: a request paused mid-decode resumes to the same tokens as an uninterrupted run; new requests are held, not refused", async () => {
    const s = await startSimEngine({ tokenizer: tok, script: { ...POLICY, seed: 7 }, latency: { prefill_ms_per_token: 0.01, decode_ms_per_token: 10 } });
    try {
      const u = s.urls[0]!;
      const engine = s.replicas[0]!.engine;
      const prompt = tok.renderIds([{ role: "user", content: String((ROWS[0]!.prompt as { content: string }[])[0]!.content) }], { addGenerationPrompt: true });
      const gen = () => fetch(`${u}/generate`, { method: "POST", headers: json, body: JSON.stringify({ input_ids: prompt, sampling_params: { max_new_tokens: 200 }, return_logprob: true }) }).then((r) => r.json() as Promise<{ output_ids: number[]; meta_info: { output_token_logprobs: unknown[] } }>);
      const plain = await gen();
      expect(plain.output_ids.length).toBeGreaterThan(5);
      const first = gen();
      while (engine.stats.inflight === 0) await Bun.sleep(1);
      await Bun.sleep(25);
      expect(await (await fetch(`${u}/pause_generation`, { method: "POST", headers: json, body: JSON.stringify({ mode: "retract" }) })).json()).toEqual({ message: "Generation paused successfully." });
      const held = gen(); // arrives during the pause: held
      // Wait for its arrival (an event, not a guess: CI once saw it arrive after 60 ms), then check it was not started.
      await waitFor(() => engine.stats.inflight === 2, "the request sent during the pause reached the engine", HANG_MS, 5);
      expect(engine.requests.at(-1)!.started_ms).toBeUndefined();
      // SGLang validates a JSON body on /continue_generation: a bodiless call is refused and resumes nothing.
      const bare = await fetch(`${u}/continue_generation`, { method: "POST" });
      expect([bare.status, ((await bare.json()) as { error: { message: string } }).error.message]).toEqual([400, "[{'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}]"]);
      expect(engine.paused).toBe(true);
      await fetch(`${u}/continue_generation`, { method: "POST", headers: json, body: "{}" });
      const [a, h] = await Promise.all([first, held]);
      expect(a).toMatchObject({ output_ids: plain.output_ids, meta_info: { output_token_logprobs: plain.meta_info.output_token_logprobs } });
      expect(h.output_ids).toEqual(plain.output_ids);
      const p = engine.pauses[0]!;
      expect(engine.requests.at(-1)!.started_ms!).toBeGreaterThanOrEqual(p.resumed_ms!);
    } finally {
      await s.stop();
    }
  });
});
