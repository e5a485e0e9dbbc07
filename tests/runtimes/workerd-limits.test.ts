import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Miniflare } from "miniflare";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitRecords, comparableRecord, startWorkerd, type Workerd } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E3: values larger than a Durable Object allows. The worker bundle in Miniflare with
// SQLite-backed objects (2 MB per key + value), sim engine, Upstash bridge.
// L: one 90,005-token turn — its checkpoint and its finished outputs are ~1–2 MB each.
// B: a 2.3 MB user message — the session's input alone is over one value.
const redis = await requireRedis();
const CONFIG = { rollout: { n: 1, prompt_length: 512, response_length: 120000, max_model_len: 131072 } };
const LONG = " a".repeat(90_000) + "\n#### 1";
const rowL = { uid: "e3L", data_source: "edge", prompt: [{ role: "user", content: "Say a, many times." }], reward_model: { style: "rule", ground_truth: "1" } };
const rowB = { uid: "e3B", data_source: "edge", prompt: [{ role: "user", content: "filler ".repeat(330_000) + "Answer with #### 1." }], reward_model: { style: "rule", ground_truth: "1" } };
let engine: RunningSimEngine;
let bridge: UpstashBridge;
let w: Workerd;
let mf: Miniflare;
const token = crypto.randomUUID();
const prefix = randomPrefix("workerd-limits");

beforeAll(async () => {
  if (!redis) return;
  engine = await startSimEngine({ script: { seed: 3, rules: [{ when: "Say a, many times.", turns: [LONG] }], default: ["The answer is 1.\n#### 1"] }, maxModelLen: 131072 });
  bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
  w = await startWorkerd({
    EDGELOOP_ENGINE_URL: engine.urls[0]!,
    EDGELOOP_ENGINE_FORMAT: "vllm",
    EDGELOOP_CONFIG: JSON.stringify(CONFIG),
    EDGELOOP_STORE_PREFIX: prefix,
    UPSTASH_REDIS_REST_URL: bridge.url,
    UPSTASH_REDIS_REST_TOKEN: token,
    EDGELOOP_ALLOW_ANONYMOUS: "1",
  });
  mf = w.mf;
}, HANG_MS);

afterAll(async () => {
  await w?.stop();
  await engine?.stop();
  await bridge?.stop();
  await deleteByPrefix(prefix);
});

const post = (rows: unknown[]) => mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });

/** The same row on the Bun path (memory store, in-process executor) against the same engine. */
async function bunRecord(row: unknown): Promise<TrajectoryRecord> {
  const rt = await buildRuntime({ engine: engine.urls[0], n: 1, promptLength: 512, responseLength: 120000, maxModelLen: 131072 });
  try {
    const { run } = rt.service.submit({ rows: [row], global_steps: -1, model_version: null, validate: false });
    await run.run();
    return run.records()[0]!;
  } finally {
    await rt.close();
  }
}

describe.skipIf(!redis)("E3: Durable Object values within SQLite-backed limits (workerd)", () => {
  test("probe: a SQLite-backed object stores a 2,000,000-char value and refuses 2,200,000 (SQLITE_TOOBIG); the storage's parts (≤ 500,000 UTF-16 units) store, also two-byte", async () => {
    const probe = new Miniflare({
      modules: true,
      compatibilityDate: "2026-04-07",
      durableObjects: { P: { className: "P", useSQLite: true } },
      script: `export class P {
        constructor(ctx) { this.ctx = ctx; }
        async fetch(req) {
          const u = new URL(req.url);
          const v = (u.searchParams.get("c") ?? "x").repeat(Number(u.searchParams.get("n")));
          try { await this.ctx.storage.put("v", v); return new Response("stored " + (await this.ctx.storage.get("v")).length); }
          catch (e) { return new Response(String(e), { status: 500 }); }
        }
      }
      export default { fetch: (req, env) => env.P.get(env.P.idFromName("probe")).fetch(req) };`,
    });
    try {
      const put = async (n: number, c = "x") => {
        const r = await probe.dispatchFetch(`http://p/?n=${n}&c=${encodeURIComponent(c)}`);
        return [r.status, await r.text()];
      };
      expect(await put(2_000_000)).toEqual([200, "stored 2000000"]);
      const [status, text] = await put(2_200_000);
      expect(status).toBe(500);
      expect(text).toContain("SQLITE_TOOBIG");
      const { SQLITE_BACKEND_VALUE_BYTES } = await import("../../infra/cloudflare/do-session-storage.ts");
      const units = SQLITE_BACKEND_VALUE_BYTES / 2;
      expect(await put(units, "ア")).toEqual([200, `stored ${units}`]);
    } finally {
      await probe.dispose();
    }
  });

  test("L: one turn of 90,005 tokens → one record, 90,005 response tokens, reward 1, equal to Bun's; the engine called once", async () => {
    const before = engine.replicas[0]!.engine.stats.requests;
    const res = await post([rowL]);
    expect(res.status).toBe(202);
    const records = await awaitRecords(prefix, ["e3L"], 1, 120_000);
    const r = records.get("e3L_0_0")!;
    expect(r.error).toBeNull();
    expect(r.response_ids.length).toBe(90_005);
    expect(r.reward_score).toBe(1);
    expect(engine.replicas[0]!.engine.stats.requests - before).toBe(1);
    // The object checkpointed in parts and is done.
    const st = await mf.dispatchFetch("http://localhost/v1/sessions/e3L_0_0");
    expect(await st.json()).toMatchObject({ phase: "done" });
    const ref = await bunRecord(rowL);
    expect(comparableRecord(r)).toEqual(comparableRecord(ref));
  }, HANG_MS);

  test("B: a 2.3 MB user message → 202; a record with a 512-token left-truncated prompt, prompt_truncated; the group completes", async () => {
    const res = await post([rowB]);
    expect(res.status).toBe(202);
    const records = await awaitRecords(prefix, ["e3B"], 1, 120_000);
    const r = records.get("e3B_0_0")!;
    expect(r.error).toBeNull();
    expect(r.prompt_ids.length).toBe(512);
    expect(r.extra_fields.prompt_truncated).toBe(true);
    expect(r.reward_score).toBe(1);
    const raw = rawRedis();
    try {
      expect(await raw.exists(`${prefix}group:e3B`)).toBe(1);
    } finally {
      await raw.quit();
    }
    const ref = await bunRecord(rowB);
    expect(comparableRecord(r)).toEqual(comparableRecord(ref));
  }, HANG_MS);
});
