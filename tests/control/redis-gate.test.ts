import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { spawnCli, spawnServe, until, type CliProc } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

/** The flags shared with serve minus --n: a worker runs each job with its batch's rollout section and refuses --n. */
const workerFlags = (flags: string[]): string[] => flags.filter((_, i) => flags[i] !== "--n" && flags[i - 1] !== "--n");

// The Redis engine gate across processes: `edgeloop serve --jobs queue` takes the trainer's
// pause → model-version → resume while one `edgeloop worker` (another process) runs the batch
// against a simulated vLLM replica in this process. The worker must start no engine call while
// the gate in Redis is closed, resume its aborted turns after it, and record the versions exactly.

const ROW_COUNT = 6;
const N = 2;
const rows = Array.from({ length: ROW_COUNT }, (_, i) => ({ ...ROWS[i]!, uid: `rg${i}` }));
const LATENCY = { prefill_ms_per_token: 0, decode_ms_per_token: 6 };
const json = { "content-type": "application/json" };
const redisUp = await requireRedis();

let tok: ChatTokenizer;
let reference: Map<string, TrajectoryRecord>;
const procs: CliProc[] = [];
let sim: RunningSimEngine | undefined;
const prefix = randomPrefix("redis-gate");

beforeAll(async () => {
  tok = await defaultTokenizer();
  // The reference: the same batch, uninterrupted, in-process (memory store).
  const ref = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
  const rt = await buildRuntime({ engine: ref.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096 });
  await rt.service.policy.set("v1");
  const b = rt.service.submit({ rows, global_steps: -1, model_version: null, validate: false });
  await b.run.run();
  reference = new Map(b.run.records().map((r) => [r.key, r]));
  await rt.close();
  await ref.stop();
  expect(reference.size).toBe(ROW_COUNT * N);
});

afterAll(async () => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill();
  await Promise.all(procs.map((p) => p.proc.exited));
  await sim?.stop();
  if (redisUp) await deleteByPrefix(prefix);
});

describe.skipIf(!redisUp)("Redis engine gate: serve pauses, a worker process holds its calls", () => {
  test("abort pause mid-batch: no engine call starts during the pause, the batch completes with the uninterrupted tokens and exact token_versions", async () => {
    sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    const engine = sim.replicas[0]!.engine;
    const common = ["--store", REDIS_URL, "--store-prefix", prefix, "--engine", sim.urls[0]!, "--n", String(N), "--seed", "7", "--max-model-len", "4096"];
    const serve = await spawnServe([...common, "--jobs", "queue"]);
    procs.push(serve);
    const worker = spawnCli(["worker", ...workerFlags(common), "--concurrency", "16", "--idle-exit", "20", "--consumer", "rg-w1"]);
    procs.push(worker);
    const api = (path: string, body?: unknown) => fetch(`${serve.url}${path}`, { method: "POST", headers: json, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });

    expect((await api("/v1/model-version", { version: "v1" })).status).toBe(200);
    const sub = await api("/v1/rollouts", { rows });
    expect(sub.status).toBe(202);
    const { batch_id, keys } = (await sub.json()) as { batch_id: string; keys: string[] };
    expect(keys.sort()).toEqual([...reference.keys()].sort());

    // Pause while the worker's requests are mid-generation.
    // (at least 3 requests generating for 15–60 ms: each has tokens out and, at 6 ms a token and ≥ 30
    // tokens a turn, over 100 ms to go, however slowly the pause call goes on a loaded machine)
    const midway = () => engine.requests.filter((l) => l.started_ms !== undefined && l.ended_ms === undefined && Date.now() - l.started_ms >= 15 && Date.now() - l.started_ms <= 60).length;
    await until(async () => engine.stats.completion_tokens > 100 && midway() >= 3, "the worker's requests in flight", HANG_MS, 2);
    const paused = await api("/v1/engine/pause", { mode: "abort" });
    const pauseReturned = Date.now();
    expect(paused.status).toBe(200);
    const ps = (await paused.json()) as { paused: boolean; mode: string; since_ms: number; epoch: number };
    expect(ps).toMatchObject({ paused: true, mode: "abort" });
    expect(engine.paused).toBe(true);
    expect(engine.stats.inflight).toBe(0);

    // The "weight update": long enough that a worker ignoring the gate would show.
    await Bun.sleep(400);
    const requestsAtUpdate = engine.requests.length;
    expect((await api("/v1/model-version", { version: "v2" })).status).toBe(200);
    const resumed = await api("/v1/engine/resume");
    expect(resumed.status).toBe(200);
    expect(await resumed.json()).toMatchObject({ paused: false, epoch: ps.epoch + 1 });

    const done = await until(async () => {
      const r = (await (await fetch(`${serve.url}/v1/rollouts/${batch_id}`)).json()) as { done: boolean; counts: { ok: number } };
      return r.done ? r : null;
    }, "the batch done", 60_000, 50);
    expect(done.counts.ok).toBe(ROW_COUNT * N);

    const pause = engine.pauses[0]!;
    expect(engine.pauses.length).toBe(1);
    expect(pause.mode).toBe("abort");
    const start = ps.since_ms;
    expect(start).toBeLessThanOrEqual(pause.paused_ms);
    // No engine request arrived while the engine was paused (the worker held every call at the
    // Redis gate). A call the gate admitted just before it closed may arrive between the close and
    // the engine's pause (the pause waits for it to be sent): then it is aborted by the pause like
    // the others, never held through it.
    // Arrival order (seq), not the millisecond: a request in the pause's millisecond but before it is not "during".
    expect(engine.requests.filter((l) => l.seq! > pause.after_seq && l.received_ms! < pause.resumed_ms!)).toEqual([]);
    expect(engine.requests.filter((l) => l.received_ms! < pause.resumed_ms! && l.ended_ms! > pauseReturned)).toEqual([]);
    expect(engine.requests.slice(requestsAtUpdate).every((l) => l.received_ms! >= pause.resumed_ms!)).toBe(true);
    // Requests in flight at the pause were aborted by it, some with tokens kept.
    // (Requests received after the close were admitted before it: the gate hands out no call while closed.)
    const spanning = engine.requests.filter((l) => l.started_ms! < start && l.ended_ms! >= start);
    expect(spanning.length).toBeGreaterThan(0);
    expect(spanning.every((l) => l.ended_ms! <= pauseReturned)).toBe(true);
    expect(spanning.some((l) => l.finish_reason === "abort" && l.completion_tokens! > 0)).toBe(true);

    let twoSegmentTurns = 0;
    for (const key of keys) {
      const r = (await (await fetch(`${serve.url}/v1/trajectories/${key}`)).json()) as TrajectoryRecord;
      const ref = reference.get(key)!;
      expect(r.error).toBeNull();
      expect(r.response_ids).toEqual(ref.response_ids);
      expect(r.response_mask).toEqual(ref.response_mask);
      // vLLM reports no version: a call's tokens carry the version current when the worker sent it.
      const first = engine.requests.find((l) => l.routing_key === key && l.received_ms! >= pause.resumed_ms!);
      const b0 = first ? first.prompt_tokens - r.prompt_ids.length : undefined;
      const expected = b0 === undefined ? [[0, "v1"]] : b0 === 0 ? [[0, "v2"]] : [[0, "v1"], [b0, "v2"]];
      expect(r.extra_fields.token_versions).toEqual(expected);
      const cut = b0 ?? r.response_ids.length;
      expect(r.rollout_log_probs!.slice(0, cut)).toEqual(ref.rollout_log_probs!.slice(0, cut));
      if (b0 !== undefined && b0 > 0 && r.response_mask[b0 - 1] === 1) twoSegmentTurns++;
    }
    // At least one turn was cut by the abort and resumed under v2 with its partial tokens kept.
    expect(twoSegmentTurns).toBeGreaterThan(0);
    expect(worker.proc.exitCode).toBeNull();
  }, HANG_MS);
});

describe.skipIf(!redisUp)("RedisEngineGate", () => {
  test("a pause waits for the calls admitted before the close to be sent, then pauses the replicas; a closed gate admits nothing", async () => {
    const { IoRedisCommander } = await import("../../infra/redis/ioredis-commander.ts");
    const { EngineControl, MemoryEngineGate, RedisEngineGate } = await import("../../shared/inference/engine-control.ts");
    const c = new IoRedisCommander(REDIS_URL);
    try {
      for (const gate of [new RedisEngineGate(c, { prefix: `${prefix}fence:`, pollMs: 5 }), new MemoryEngineGate()]) {
        const log: string[] = [];
        const control = new EngineControl({ gate, format: "vllm", pollMs: 2, replicas: () => [{ url: "http://r0", fetch: async (u) => (log.push(`replica ${new URL(String(u)).pathname}`), new Response("{}")) }] });
        let send!: () => void;
        const admitted = new Promise<() => void>((r) => {
          void gate.run(async (sent) => {
            r(sent);
            await new Promise<void>((s) => (send = s));
            log.push("call sent");
            sent();
            await Bun.sleep(30);
          });
        });
        const sent = await admitted;
        expect(await gate.starting()).toBe(1);
        expect(await gate.inflight()).toBe(1);
        const pausing = control.pause({ mode: "abort", clear_cache: false });
        await Bun.sleep(40);
        expect(log).toEqual([]); // the gate is closed, the pause waits for the admitted call
        expect((await gate.state()).paused).toBe(true);
        send();
        const st = await pausing;
        expect(log).toEqual(["call sent", "replica /pause"]);
        expect(st).toMatchObject({ paused: true, mode: "abort", inflight: 1 });
        expect(await gate.starting()).toBe(0);
        sent(); // idempotent
        // Closed: a new call waits for the resume.
        let ran = false;
        const held = gate.run(async () => void (ran = true));
        await Bun.sleep(40);
        expect(ran).toBe(false);
        await control.resume();
        await held;
        expect(ran).toBe(true);
        await Bun.sleep(40);
        expect(await gate.inflight()).toBe(0);
        expect(log).toEqual(["call sent", "replica /pause", "replica /resume"]);
      }
    } finally {
      await deleteByPrefix(`${prefix}fence:`);
      await c.close();
    }
  });

  test("per call: one EVAL on the call's path; the removals are coalesced (64 concurrent calls: 64 EVALs, a few ZREMs)", async () => {
    const { IoRedisCommander } = await import("../../infra/redis/ioredis-commander.ts");
    const { RedisEngineGate } = await import("../../shared/inference/engine-control.ts");
    const c = new IoRedisCommander(REDIS_URL);
    const seen: string[] = [];
    const counting = { exec: (cmd: (string | Uint8Array)[]) => (seen.push(String(cmd[0])), c.exec(cmd)), pipeline: (cs: (string | Uint8Array)[][]) => (seen.push(...cs.map((x) => String(x[0]))), c.pipeline(cs)), close: () => c.close() };
    try {
      const gate = new RedisEngineGate(counting, { prefix: `${prefix}cost:` });
      await Promise.all(Array.from({ length: 64 }, () => gate.run(async (sent) => (sent(), Bun.sleep(5)))));
      await Bun.sleep(20);
      expect(seen.filter((x) => x === "EVAL").length).toBe(64);
      const zrem = seen.filter((x) => x === "ZREM").length;
      expect(zrem).toBeGreaterThanOrEqual(2);
      expect(zrem).toBeLessThanOrEqual(8);
      expect(seen.length).toBe(64 + zrem);
      expect([await gate.inflight(), await gate.starting()]).toEqual([0, 0]);
    } finally {
      await deleteByPrefix(`${prefix}cost:`);
      await c.close();
    }
  });
});
