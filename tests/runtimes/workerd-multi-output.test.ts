import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitGroups, ROOT, workerdFixture } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Edge case E1 on the Durable Object path: a Worker entry that registers a custom loop
// (`registerWorkerAgentLoop`) returning 2, 3 or 0 outputs per session, bundled by wrangler and
// run in workerd (Miniflare, SQLite-backed objects). Every output is written by its object.
const redis = await requireRedis();
const wd = workerdFixture("workerd-multi", { enabled: redis, entry: join(ROOT, "tests", "runtimes", "fixtures", "multi-output-worker.ts") });

describe.skipIf(!redis)("E1 in workerd: Durable Object sessions with several outputs", () => {
  test("2, 3 and 0 outputs per session (n = 2): every output written; each group completes once its sessions finished", async () => {
    const base = { data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" }, agent_name: "multi_output_agent" };
    const rows = [
      { ...base, uid: "wdm0" },
      { ...base, uid: "wdm3", extra_info: { outputs: 3 } },
      { ...base, uid: "wdm-none", extra_info: { outputs: 0 } },
    ];
    const res = await wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix: wd.s.prefix });
    try {
      expect(await awaitGroups(wd.s.prefix, rows.map((r) => r.uid))).toEqual([
        ["wdm0", 2, 2, 4, 0],
        ["wdm3", 2, 2, 6, 0],
        ["wdm-none", 2, 2, 0, 0],
      ]);
      expect((await q.sessionRecords("wdm0", 0))!.map((r) => [r.key, r.agent_name, r.error, r.num_turns])).toEqual([
        ["wdm0_0_0", "multi_output_agent", null, 2],
        ["wdm0_0_1", "multi_output_agent", null, 2],
      ]);
      expect((await q.sessionRecords("wdm3", 1))!.map((r) => r.key)).toEqual(["wdm3_1_0", "wdm3_1_1", "wdm3_1_2"]);
      expect(await q.sessionRecords("wdm-none", 1)).toEqual([]);
      const groups = await q.readCompleteGroups({ consumer: "t", max: 10 });
      expect(groups.map((g) => [g.uid, g.records.length]).sort()).toEqual([["wdm-none", 0], ["wdm0", 4], ["wdm3", 6]]);
      const st = await wd.mf.dispatchFetch("http://localhost/v1/sessions/wdm3_0_0");
      expect(await st.json()).toMatchObject({ phase: "done" });
    } finally {
      await q.close();
    }
  }, HANG_MS);
});
