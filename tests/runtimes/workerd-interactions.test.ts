import { describe, expect, test } from "bun:test";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitGroups, batchRows, workerdFixture } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 18 item 8 on Cloudflare Workers: the simulated users of EDGELOOP_TOOLS (`interactions`, here the
// example server's gsm8k_user, signed with EDGELOOP_TOOLS_SECRET) reached from a row's
// extra_info.interaction_kwargs, in Durable Object sessions run by workerd.
const redis = await requireRedis();
const wd = workerdFixture("workerd-interactions", { enabled: redis, timeoutMs: 90_000 });

describe.skipIf(!redis)("workerd: simulated users from EDGELOOP_TOOLS", () => {
  test("a row with interaction_kwargs (no name: the first configured) is judged by gsm8k_user; one without is not", async () => {
    // Row 0 of the example data: a calc call, then "#### 31" (right). Its twin without interaction_kwargs ends with the model.
    const [row] = batchRows("wdi");
    const withUser = { ...row, uid: "wdi-user", extra_info: { ...(row!.extra_info as object), interaction_kwargs: { ground_truth: "31" } } };
    const without = { ...row, uid: "wdi-plain" };
    const res = await wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [withUser, without] }) });
    expect({ status: res.status, body: res.status === 202 ? null : await res.text() }).toEqual({ status: 202, body: null });
    expect(await awaitGroups(wd.s.prefix, ["wdi-user", "wdi-plain"])).toEqual([
      ["wdi-user", 2, 2, 2, 0],
      ["wdi-plain", 2, 2, 2, 0],
    ]);
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix: wd.s.prefix });
    try {
      const pick = async (uid: string) => (await q.sessionRecords(uid, 0))!.map((r) => [r.error, r.num_turns, r.reward_score, r.extra_fields.turn_scores, r.extra_fields.terminated_by]);
      // num_turns = user turns (the tool result) + assistant turns (2) + 1; the simulated user's terminating
      // turn adds one user turn but no tokens (the response ids are the plain run's).
      expect(await pick("wdi-user")).toEqual([[null, 5, 1, [1], "interaction"]]);
      expect(await pick("wdi-plain")).toEqual([[null, 4, 1, [], "model"]]);
      const user = (await q.sessionRecords("wdi-user", 0))![0]!;
      const plain = (await q.sessionRecords("wdi-plain", 0))![0]!;
      expect(user.response_ids).toEqual(plain.response_ids);
    } finally {
      await q.close();
    }
    const stats = (await (await fetch(`${wd.s.tools.url}/stats`)).json()) as { interactions?: Record<string, number> };
    expect(stats.interactions).toEqual({ gsm8k_user: 2 });
  }, HANG_MS);
});
