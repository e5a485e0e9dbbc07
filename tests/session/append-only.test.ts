import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { StoreError } from "../../shared/errors.ts";
import { StoreUnreachableError } from "../../shared/store/store-outage.ts";
import { CHECKPOINT_VERSION, packOutput, StoredOutput, unpackOutput } from "../../shared/session/checkpoint.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import { fromParts, splitValue, toParts } from "../../shared/session/value-parts.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { comparable, depsFor, inputFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Append-only checkpoints (v2): a commit writes the turn's delta, never the whole trajectory;
// every stored value stays within the backend's limit; a resumed session sees exactly the
// committed prefix.
const redis = await requireRedis();
const prefix = randomPrefix("append-only");
let tools: ToolServer;
let commander: IoRedisCommander;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
  commander = new IoRedisCommander(REDIS_URL);
});
afterAll(async () => {
  await tools.stop();
  await commander.close();
  await deleteByPrefix(prefix);
});

const LONG = " a".repeat(90_000) + "\n#### 1";
const longRollout = rolloutConfig({ response_length: 120000, max_model_len: 131072 });
const longInput = (uid: string) => ({
  ...inputFor(0, 0, longRollout, uid),
  kwargs: { uid, session_id: 0, global_steps: 0, key: `${uid}_0_0`, data_source: "edge", prompt: [{ role: "user", content: "Say a, many times." }], reward_model: { style: "rule", ground_truth: "1" } },
});

async function longDeps() {
  const { deps, tok } = await depsFor(tools.url);
  const engine = new SimEngine({ tokenizer: tok, maxModelLen: 131072, script: { seed: 3, rules: [{ when: "Say a, many times.", turns: [LONG] }], default: ["x"] } });
  deps.client = new SimEngineClient(engine);
  deps.maxModelLen = 131072;
  return { deps, engine };
}

/** Counts commits and the largest delta written. */
function watching(inner: SessionStorage) {
  const seen = { commits: 0, maxDelta: 0, total: 0 };
  const storage: SessionStorage = {
    get: (k) => inner.get(k),
    delete: (k) => inner.delete(k),
    append: async (k, step, d, o) => {
      seen.commits++;
      seen.maxDelta = Math.max(seen.maxDelta, d.length);
      seen.total += d.length;
      return inner.append(k, step, d, o);
    },
  };
  return { storage, seen };
}

describe("value parts", () => {
  test("splits by UTF-8 bytes without cutting a character or a surrogate pair; parts join back to the values", () => {
    const s = "ab€😀".repeat(1000);
    for (const max of [4, 5, 7, 64, 1000]) {
      const pieces = splitValue(s, max);
      expect(pieces.join("")).toBe(s);
      for (const p of pieces) expect(new TextEncoder().encode(p).byteLength).toBeLessThanOrEqual(max);
      for (const p of pieces) expect(p).not.toMatch(/^[\udc00-\udfff]|[\ud800-\udbff]$/);
    }
    const parts = [...toParts("x".repeat(25), 10), ...toParts("short", 10), ...toParts("y".repeat(9), 10)];
    expect(parts).toEqual(["+xxxxxxxxx", "+xxxxxxxxx", ".xxxxxxx", ".short", ".yyyyyyyyy"]);
    expect(fromParts(parts)).toEqual(["x".repeat(25), "short", "y".repeat(9)]);
    // An uncommitted trailing run (no "." part) is not a value.
    expect(fromParts(["+ab", ".c", "+de"])).toEqual(["abc"]);
    expect(splitValue("ア".repeat(10), 8, "utf16")).toEqual(["アアアア", "アアアア", "アア"]);
  });
});

describe("packed outputs", () => {
  test("token arrays round-trip bit-exact: float32 log-probs as float32, any other value as float64 (0.1, NaN, -0 kept)", () => {
    const base = { prompt_ids: [151644, 0, 2147483647], response_ids: [5, 6, 7], response_mask: [1, 0, 1] as (0 | 1)[], reward_score: 1, num_turns: 2, truncated: false, finish_reason: "stop" as const, metrics: { generate_sequences: 0.5, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: { a: [1] } };
    const f32 = { ...base, response_logprobs: [Math.fround(-0.25), -0, Math.fround(-1.1)] };
    const p32 = packOutput(f32);
    expect(p32.logprobs_f64).toBeUndefined();
    const u32 = unpackOutput(StoredOutput.parse(JSON.parse(JSON.stringify(p32))));
    expect(u32).toEqual(f32);
    expect(Object.is(u32.response_logprobs![1], -0)).toBe(true);
    const f64 = { ...base, response_logprobs: [0.1, Number.NaN, -2] };
    const p64 = packOutput(f64);
    expect(p64.logprobs_f64).toBe(true);
    expect(unpackOutput(StoredOutput.parse(JSON.parse(JSON.stringify(p64))))).toEqual(f64);
    expect(unpackOutput(packOutput({ ...base, response_logprobs: null })).response_logprobs).toBeNull();
  });
});

describe("append-only checkpoints", () => {
  test("tool_agent: each commit writes only its delta; the stored log folds to the same state", async () => {
    const { deps } = await depsFor(tools.url);
    const mem = new MemorySessionStorage();
    const { storage, seen } = watching(mem);
    const input = inputFor(3, 0, undefined, "delta");
    const s = (await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps) }, input))!;
    const r = await s.run();
    expect(r.status).toBe("finished");
    const stored = (await mem.get(input.key))!;
    expect(stored.deltas.length).toBe(seen.commits);
    const parsed = stored.deltas.map((d) => JSON.parse(d));
    expect(parsed.every((d) => d.v === CHECKPOINT_VERSION)).toBe(true);
    // The prompt ids are written once (the first commit with a builder), never again.
    expect(parsed.filter((d) => d.loop?.builder?.prompt_ids !== undefined).length).toBe(1);
    // Messages: each commit carries only those added since the previous one.
    const msgs = parsed.filter((d) => d.loop).map((d) => [d.loop.messages_from, d.loop.messages.length]);
    for (let i = 1; i < msgs.length; i++) expect(msgs[i]![0]).toBe(msgs[i - 1]![0] + msgs[i - 1]![1]);
  });

  for (const [name, make] of [
    ["memory", () => new MemorySessionStorage(undefined, { maxValueBytes: 100_000 })],
    ["redis", () => new RedisSessionStorage(commander, { prefix, maxValueBytes: 100_000, maxCommandBytes: 300_000 })],
  ] as const) {
    test.skipIf(name === "redis" && !redis)(`${name}: a 90,005-token turn checkpoints in parts of ≤ 100 kB; the record equals a run without sessions; the engine is called once`, async () => {
      const { deps, engine } = await depsFor(tools.url).then(async () => longDeps());
      const inner = make();
      const { storage, seen } = watching(inner);
      const input = longInput(`long${name}`);
      const s = (await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps) }, input))!;
      const r = await s.run();
      if (r.status !== "finished") throw new Error(JSON.stringify(r));
      const out = r.outputs[0]!;
      expect(out.response_ids.length).toBe(90_005);
      expect(out.reward_score).toBe(1);
      expect(engine.stats.requests).toBe(1);
      // A delta holding the 90k-token turn is over 1 MB; stored as parts, each within the limit.
      expect(seen.maxDelta).toBeGreaterThan(1_000_000);
      if (inner instanceof MemorySessionStorage) expect(inner.values(input.key)).toBeGreaterThan(seen.commits + 10);
      else {
        const raw = rawRedis();
        try {
          const h = inner.hashKey(input.key);
          const fields = await raw.hkeys(h);
          expect(fields.filter((f) => f.startsWith("p:")).length).toBeGreaterThan(seen.commits + 10);
          expect(fields.filter((f) => f.startsWith("s:"))).toEqual([]); // staged parts were moved in
          for (const f of fields) expect(await raw.hstrlen(h, f)).toBeLessThanOrEqual(100_000);
        } finally {
          await raw.quit();
        }
      }
      // The same row without durable sessions: identical trajectory.
      const { deps: d2 } = await longDeps();
      const loop = sessionLoopFactory(d2)(SessionInputOf(input));
      const ref = (await loop.run(input.sampling_params as never, input.kwargs as never)) as AgentLoopOutput;
      expect(comparable(out)).toEqual(comparable(ref));
    }, HANG_MS);
  }

  test("a retryable storage failure on the commit after a 90k-token generation is retried in place: the engine is called once", async () => {
    const { deps, engine } = await longDeps();
    const mem = new MemorySessionStorage();
    let appends = 0;
    const flaky: SessionStorage = {
      get: (k) => mem.get(k),
      delete: (k) => mem.delete(k),
      append: async (k, step, d, o) => {
        // The 2nd commit holds the generated turn; it fails twice (store briefly down), then lands.
        if (++appends === 2 || appends === 3) throw new StoreError("session storage: connection lost", { retryable: true });
        return mem.append(k, step, d, o);
      },
    };
    const input = longInput("flaky");
    const s = (await TrajectorySession.open(input.key, { storage: flaky, createLoop: sessionLoopFactory(deps) }, input))!;
    const r = await s.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    expect(r.outputs[0]!.response_ids.length).toBe(90_005);
    expect(engine.stats.requests).toBe(1);
    expect((await mem.get(input.key))!.deltas.length).toBe(appends - 2);
  }, HANG_MS);

  test("a store outage on the commit after a 90k-token generation is waited out in place, past the retry count: the engine is called once", async () => {
    const { deps, engine } = await longDeps();
    const mem = new MemorySessionStorage();
    let appends = 0;
    const down: SessionStorage = {
      get: (k) => mem.get(k),
      delete: (k) => mem.delete(k),
      append: async (k, step, d, o) => {
        // The 2nd commit holds the generated turn; the store is unreachable for 4 attempts (commitRetries is 1).
        if (++appends >= 2 && appends <= 5) throw new StoreUnreachableError("store redis://127.0.0.1:1 unreachable: connect ECONNREFUSED");
        return mem.append(k, step, d, o);
      },
    };
    const input = longInput("outage");
    const s = (await TrajectorySession.open(input.key, { storage: down, createLoop: sessionLoopFactory(deps), commitRetries: 1 }, input))!;
    const r = await s.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    expect(r.outputs[0]!.response_ids.length).toBe(90_005);
    expect(engine.stats.requests).toBe(1);
    expect((await mem.get(input.key))!.deltas.length).toBe(appends - 4);
  }, HANG_MS);

  test.skipIf(!redis)("redis: a kill after a commit's parts are staged, before its script: the resumed session sees the committed prefix; no staged part is visible; the rerun's record is identical", async () => {
    const { deps } = await depsFor(tools.url);
    const inner = new RedisSessionStorage(commander, { prefix, maxValueBytes: 400, maxCommandBytes: 1_500 });
    // Dies on the 3rd commit's script call (its parts already staged by HSETs).
    let commits = 0;
    const dying = new RedisSessionStorage(
      {
        exec: async (cmd) => {
          if (String(cmd[0]).startsWith("EVAL") && ++commits === 3) throw new Error("killed");
          return commander.exec(cmd);
        },
        pipeline: (c) => commander.pipeline(c),
        close: async () => {},
      },
      { prefix, maxValueBytes: 400, maxCommandBytes: 1_500 },
    );
    const input = inputFor(3, 0, undefined, "stagekill");
    const s = (await TrajectorySession.open(input.key, { storage: dying, createLoop: sessionLoopFactory(deps), commitRetries: 0 }, input))!;
    await expect(s.run()).rejects.toThrow("killed");
    const stored = (await inner.get(input.key))!;
    expect(stored.step).toBe(1);
    expect(stored.deltas.length).toBe(2);
    // The dead commit's parts were staged (over one command's size) but never committed: present, invisible.
    const raw = rawRedis();
    const staged = (await raw.hkeys(inner.hashKey(input.key))).filter((f) => f.startsWith("s:"));
    await raw.quit();
    expect(staged.length).toBeGreaterThan(1);
    const resumed = (await TrajectorySession.open(input.key, { storage: inner, createLoop: sessionLoopFactory(deps) }))!;
    const r = await resumed.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    const ref = (await TrajectorySession.open("ref_0_0", { storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps) }, inputFor(3, 0, undefined, "ref")))!;
    const rr = await ref.run();
    const strip = (o: AgentLoopOutput) => comparable(o);
    expect(strip(r.outputs[0]!)).toEqual(strip((rr as { outputs: AgentLoopOutput[] }).outputs[0]!));
  }, HANG_MS);

  test.skipIf(!redis)("another checkpoint version is refused with a clear, non-retryable error (v1 hash, v1 delta)", async () => {
    const raw = rawRedis();
    const storage = new RedisSessionStorage(commander, { prefix });
    try {
      await raw.hset(storage.hashKey("old_0_0"), "input", "{}", "cp", JSON.stringify({ v: 1 }), "step", "3");
      const e1 = await storage.get("old_0_0").catch((e) => e);
      expect(e1).toBeInstanceOf(StoreError);
      expect([e1.code, e1.retryable]).toEqual(["checkpoint_version", false]);
      expect(e1.message).toContain("version 1");
      const mem = new MemorySessionStorage();
      const inp = inputFor(0, 0, undefined, "v1");
      await mem.append(inp.key, 0, JSON.stringify({ v: 1, key: inp.key, step: 0 }), { input: JSON.stringify(inp) });
      const { deps } = await depsFor(tools.url);
      const e2 = await TrajectorySession.open(inp.key, { storage: mem, createLoop: sessionLoopFactory(deps) }).catch((e) => e);
      expect(e2).toBeInstanceOf(StoreError);
      expect([e2.code, e2.retryable, e2.message]).toEqual(["checkpoint_version", false, "session 'v1_0_0': stored checkpoint is version 1; this edgeloop reads versions 2 and 3 only (finish or drop sessions before upgrading)"]);
    } finally {
      await raw.quit();
    }
  });
});

function SessionInputOf(i: ReturnType<typeof longInput>) {
  return { ...i, model_version: i.model_version ?? null } as never;
}
