import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitRecords, ROOT, startWorkerd, type Workerd } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 29 item 3 on Cloudflare Workers: a tools file with a `sandbox:` block in EDGELOOP_TOOLS. Each session's
// Durable Object holds its trajectory's lease in the Redis lease store (over the Upstash bridge), releases it when the
// trajectory ends, and the reaper object's alarm releases leases whose owner stopped refreshing them.
const redis = await requireRedis();
const TTL_S = 3;
let provider: SandboxProvider;
let engine: RunningSimEngine;
let bridge: UpstashBridge;
let w: Workerd;
let commander: IoRedisCommander;
let store: RedisLeaseStore;
const prefix = randomPrefix("workerd-sandbox");
const token = crypto.randomUUID();

beforeAll(async () => {
  if (!redis) return;
  provider = startSandboxProvider({ port: 0 });
  engine = await startSimEngine({ script: JSON.parse(readFileSync(join(ROOT, "examples", "policy-sandbox.json"), "utf8")), maxModelLen: 4096 });
  bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
  const tools = JSON.parse(readFileSync(join(ROOT, "examples", "sandbox-tools.json"), "utf8").replaceAll("http://127.0.0.1:8125/", `${provider.url}/`));
  tools.sandbox.ttl_s = TTL_S;
  w = await startWorkerd({
    EDGELOOP_ENGINE_URL: engine.urls[0]!,
    EDGELOOP_ENGINE_FORMAT: "vllm",
    EDGELOOP_TOOLS: JSON.stringify(tools),
    EDGELOOP_CONFIG: JSON.stringify({ rollout: { n: 2, prompt_length: 1024, response_length: 1024, max_model_len: 4096 } }),
    EDGELOOP_STORE_PREFIX: prefix,
    UPSTASH_REDIS_REST_URL: bridge.url,
    UPSTASH_REDIS_REST_TOKEN: token,
    EDGELOOP_ALLOW_ANONYMOUS: "1",
  });
  commander = new IoRedisCommander(REDIS_URL);
  store = new RedisLeaseStore(commander, { prefix });
}, HANG_MS);
afterAll(async () => {
  await w?.stop();
  await commander?.close();
  await provider?.stop();
  await engine?.stop();
  await bridge?.stop();
  if (redis) await deleteByPrefix(prefix);
});

/** Polls `get` every 50 ms until `done` holds (at most `ms`), then returns its last value; throws with it past the bound. */
async function until<T>(get: () => T | Promise<T>, done: (v: T) => boolean, ms: number): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await get();
    if (done(v)) return v;
    if (Date.now() > end) throw new Error(`not reached after ${ms} ms: ${JSON.stringify(v)}`);
    await Bun.sleep(50);
  }
}

const post = (body: unknown) => w.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

describe.skipIf(!redis)("workerd: sandbox leases held by Durable Object sessions", () => {
  test("each trajectory writes and reads its own sandbox; one create and one release (finished) per trajectory; records carry extra_fields.sandbox", async () => {
    const rows = readFileSync(join(ROOT, "examples", "sandbox-notes.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l, i) => ({ ...JSON.parse(l), uid: `wdsbx${i}` }));
    const res = await post({ rows });
    expect(res.status).toBe(202);
    const records = await awaitRecords(prefix, ["wdsbx0", "wdsbx1", "wdsbx2"], 2, 60_000);
    expect(records.size).toBe(6);
    const tok = await defaultTokenizer();
    const sandboxIds: string[] = [];
    for (const [key, r] of records) {
      expect([key, r.error]).toEqual([key, null]);
      const text = tok.decode(r.response_ids, { skipSpecialTokens: false });
      const observations = [...text.matchAll(/<tool_response>\n([\s\S]*?)\n<\/tool_response>/g)].map((m) => m[1]);
      const calls = [...text.matchAll(/<tool_call>\n([\s\S]*?)\n<\/tool_call>/g)].map((m) => JSON.parse(m[1]!) as { name: string; arguments: Record<string, string> });
      expect(calls.map((c) => c.name)).toEqual(["sbx_write", "sbx_read"]);
      const { path, content } = calls[0]!.arguments as { path: string; content: string };
      // The read sees the file this trajectory wrote: both calls ran in the same sandbox.
      expect(observations).toEqual([`Wrote ${content.length} bytes to ${path}.`, content]);
      const sandbox = r.extra_fields.sandbox as { lease_id: string; sandbox_id: string };
      expect(Object.keys(sandbox).sort()).toEqual(["lease_id", "sandbox_id"]);
      expect(sandbox.lease_id).toBe(`${key}~1`);
      sandboxIds.push(sandbox.sandbox_id);
      expect([r.extra_fields.tool_calls, r.extra_fields.tool_errors]).toEqual([2, 0]);
    }
    expect(new Set(sandboxIds).size).toBe(6);
    // Releases follow the record writes: waited for, bounded.
    const stats = await until(() => provider.stats(), (s) => s.releases >= 6, HANG_MS);
    expect({ created: stats.created, live: stats.live, releases: stats.releases, destroyed_released: stats.destroyed_released, duplicate_creates: stats.duplicate_creates, release_not_found: stats.release_not_found, tool_calls: stats.tool_calls }).toEqual({
      created: 6,
      live: 0,
      releases: 6,
      destroyed_released: 6,
      duplicate_creates: 0,
      release_not_found: 0,
      tool_calls: 12,
    });
    for (const [key, r] of records) {
      const rec = await store.get(key);
      expect({ status: rec?.status, reason: rec?.reason, lease_id: rec?.lease_id, sandbox_id: rec?.sandbox_id }).toEqual({ status: "released", reason: "finished", lease_id: `${key}~1`, sandbox_id: (r.extra_fields.sandbox as { sandbox_id: string }).sandbox_id });
    }
    const st = await store.stats();
    expect({ live: st.live, creating: st.creating, releasing: st.releasing, granted: st.counters.granted, confirmed: st.counters.confirmed, finished: st.counters["released:finished"] }).toEqual({ live: 0, creating: 0, releasing: 0, granted: 6, confirmed: 6, finished: 6 });
  }, HANG_MS);

  test("a lease whose owner stopped refreshing it (never released) is released by the reaper object's alarm after its TTL, reason reaped_ttl", async () => {
    const before = provider.stats();
    // An owner that took a lease, created its sandbox and vanished: nothing will ever heartbeat or release it.
    const key = "wdsbx-orphan_0_0";
    const got = await store.acquire(key, { rate_per_s: 10, burst: 2, max_live: 16 }, 10_000, { renew: true });
    expect(got.outcome).toBe("granted");
    const leaseId = got.outcome === "granted" ? got.lease.lease_id : "";
    expect(leaseId).toBe(`${key}~1`);
    const created = await fetch(`${provider.url}/sandboxes/create`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lease_id: leaseId, key, create_kwargs: {}, lifetime_s: 3600 }) });
    expect(created.status).toBe(200);
    const { sandbox_id } = (await created.json()) as { sandbox_id: string };
    expect((await store.confirm(key, leaseId, sandbox_id, TTL_S * 1000))?.status).toBe("live");
    // A trajectory of the Worker takes a lease of its own: its grant wakes the reaper, which passes until the store is empty.
    const row = { ...JSON.parse(readFileSync(join(ROOT, "examples", "sandbox-notes.jsonl"), "utf8").split("\n")[0]!), uid: "wdsbxr" };
    expect((await post({ rows: [row], config: { rollout: { n: 1 } } })).status).toBe(202);
    const records = await awaitRecords(prefix, ["wdsbxr"], 1, 60_000);
    expect(records.get("wdsbxr_0_0")?.error).toBeNull();
    const rec = await until(() => store.get(key), (r) => r?.status === "released", HANG_MS);
    expect({ status: rec?.status, reason: rec?.reason, sandbox_id: rec?.sandbox_id }).toEqual({ status: "released", reason: "reaped_ttl", sandbox_id });
    const stats = await until(() => provider.stats(), (s) => s.releases >= before.releases + 2, HANG_MS);
    expect({ created: stats.created - before.created, releases: stats.releases - before.releases, live: stats.live }).toEqual({ created: 2, releases: 2, live: 0 });
    const own = await store.get("wdsbxr_0_0");
    expect([own?.status, own?.reason]).toEqual(["released", "finished"]);
    const st = await store.stats();
    expect({ live: st.live, creating: st.creating, releasing: st.releasing, reaped: st.counters["reaped:reaped_ttl"], reapedReleased: st.counters["released:reaped_ttl"] }).toEqual({ live: 0, creating: 0, releasing: 0, reaped: 1, reapedReleased: 1 });
  }, HANG_MS);
});
