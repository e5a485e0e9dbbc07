import { afterAll, describe, expect, test } from "bun:test";
import { computeReward } from "../../shared/reward/compute-reward.ts";
import { answering, countingTarget, hugeReply, redirecting, silent } from "../helpers/hostile-servers.ts";

// Issue 26 item 1 for the reward webhook (S1, S2, S13): no redirect followed, reply capped, a deadline,
// and the reward_error names the webhook without its query string.
const target = countingTarget();
const stops: (() => void)[] = [() => target.stop()];
afterAll(() => {
  for (const s of stops) s();
});
const input = { key: "u_0_0", data_source: "d", final_answer: "#### 3", reward_model: { style: "webhook", ground_truth: "3" } };
const score = (url: string, extra: { timeout_ms?: number; max_reply_bytes?: number } = {}) =>
  computeReward(input, { webhook: { url, timeout_ms: extra.timeout_ms ?? 2000, max_retries: 2, ...(extra.max_reply_bytes ? { max_reply_bytes: extra.max_reply_bytes } : {}) }, retryMinTimeoutMs: 1 });

describe("reward webhook bounds", () => {
  test("307 to a loopback target: score null, reward_error names 307, the target is never hit, the secret nowhere", async () => {
    const r = redirecting(307, target.url);
    stops.push(r.stop);
    const out = await score(`${r.base}/score?token=SECRET`);
    expect([out.score, out.error]).toEqual([null, `webhook ${r.base}/score: answered HTTP 307 (a redirect; redirects are not followed)`]);
    expect(target.hits()).toBe(0);
  });
  test("a reward answering 300 MB: reward_error names the cap (default 4 MiB; max_reply_bytes sets it)", async () => {
    const huge = hugeReply(300 * 1024 * 1024);
    stops.push(huge.stop);
    expect((await score(`${huge.base}/score?token=SECRET`, { timeout_ms: 60_000 })).error).toBe(`webhook ${huge.base}/score: reply larger than 4194304 bytes (the cap)`);
    expect((await score(`${huge.base}/score`, { max_reply_bytes: 1000 })).error).toBe(`webhook ${huge.base}/score: reply larger than 1000 bytes (the cap)`);
  });
  test("a reward that never answers: timed out after timeout_ms (after its retries)", async () => {
    const s = silent();
    stops.push(s.stop);
    const out = await score(`${s.base}/score?token=SECRET`, { timeout_ms: 100 });
    expect([out.score, out.error]).toEqual([null, `webhook ${s.base}/score: timed out after 100 ms`]);
  });
  test("a 200 without a score: the reward_error names the webhook without its query", async () => {
    const a = answering(200, { points: 1 });
    stops.push(a.stop);
    const out = await score(`${a.base}/score?token=SECRET`);
    expect(out.error).toBe(`reward webhook ${a.base}/score: expected 200 {"score": number}`);
  });
});
