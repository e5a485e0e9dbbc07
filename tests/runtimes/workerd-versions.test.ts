import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { RedisPolicyVersions } from "../../shared/rollout/policy-version.ts";
import { REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitRecords, batchRows, workerdFixture } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 25 item 5 on the Durable Object path: the policy version lives in the store `edgeloop serve` shares
// with the Worker (`{prefix}policy`, set here over TCP as serve's POST /v1/model-version sets it). Every engine
// call of a trajectory's object reads it before it is sent, so a batch posted right after a set records that
// version on every turn; with none set, the batch's own `model_version`.
const redis = await requireRedis();
const wd = workerdFixture("workerd-versions", { enabled: redis });
let serveSide: RedisPolicyVersions;
let commander: IoRedisCommander;

beforeAll(() => {
  if (!redis) return;
  commander = new IoRedisCommander(REDIS_URL);
  serveSide = new RedisPolicyVersions(commander, { prefix: wd.s.prefix });
});

afterAll(async () => {
  await commander?.close();
});

/** Posts `rows` (batch `model_version` "batch-fallback") to the Worker; returns every record's per-turn versions and token_versions by key. */
async function runBatch(tag: string): Promise<Record<string, { turns: unknown; tokens: unknown }>> {
  const rows = batchRows(tag).slice(0, 2);
  const res = await wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, model_version: "batch-fallback" }) });
  expect(res.status).toBe(202);
  const records = await awaitRecords(wd.s.prefix, rows.map((r) => r.uid as string), 2, 60_000);
  const out: Record<string, { turns: unknown; tokens: unknown }> = {};
  for (const [key, r] of records) {
    expect(r.error).toBeNull();
    out[key] = { turns: r.extra_fields.model_versions, tokens: r.extra_fields.token_versions };
  }
  return out;
}

/** What every record of a batch must hold: each turn under `v`, one token segment. */
function allUnder(got: Record<string, { turns: unknown; tokens: unknown }>, v: string): Record<string, { turns: unknown; tokens: unknown }> {
  return Object.fromEntries(Object.entries(got).map(([k, x]) => [k, { turns: (x.turns as unknown[]).map(() => v), tokens: [[0, v]] }]));
}

describe.skipIf(!redis)("Durable Objects stamp the version set in the shared store", () => {
  test("none set: the batch's model_version; then each batch posted right after a set: that version on every turn", async () => {
    const none = await runBatch("wv0");
    expect(Object.keys(none).length).toBe(4);
    expect(none).toEqual(allUnder(none, "batch-fallback"));
    for (const [i, v] of ["step-1", "step-2"].entries()) {
      await serveSide.set(v);
      const got = await runBatch(`wv${i + 1}`);
      expect(got).toEqual(allUnder(got, v));
    }
  }, HANG_MS);
});
