import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import { computeReward } from "../../shared/reward/compute-reward.ts";
import { extractFinalAnswer, parseAnswerNumber } from "../../shared/reward/final-answer.ts";
import { ruleReward } from "../../shared/reward/rule-reward.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";

describe("final answer", () => {
  test("#### wins over the last number", () => {
    expect(extractFinalAnswer("So 3 + 4 = 7.\n#### 7\nI checked 12 times")).toBe("7");
  });
  test("last number otherwise; commas, negatives, decimals, $", () => {
    expect(extractFinalAnswer("It costs $1,234.50 in total.")).toBe("1,234.50");
    expect(extractFinalAnswer("from 3 down to -12")).toBe("-12");
    expect(extractFinalAnswer("about .5 of it")).toBe(".5");
    expect(extractFinalAnswer("She pays -$4.")).toBe("-4");
    expect(extractFinalAnswer("no numbers here")).toBe(null);
  });
  test("reasoning before </think> is ignored", () => {
    expect(extractFinalAnswer("<think>maybe 99</think>\n\nThe answer is 42<|im_end|>")).toBe("42");
    expect(extractFinalAnswer("<think>maybe 99</think>\n\nNo idea.")).toBe(null);
  });
  test("parseAnswerNumber", () => {
    expect(parseAnswerNumber("1,000")).toBe(1000);
    expect(parseAnswerNumber(" -$3.25 ")).toBe(-3.25);
    expect(parseAnswerNumber("$-3")).toBe(-3);
    expect(parseAnswerNumber("7.")).toBe(7);
    expect(parseAnswerNumber("1,00")).toBe(null);
    expect(parseAnswerNumber("abc")).toBe(null);
    expect(parseAnswerNumber("")).toBe(null);
  });
});

describe("rule reward", () => {
  test("numeric comparison", () => {
    expect(ruleReward("#### 1,000", "1000")).toBe(1.0);
    expect(ruleReward("The total is $1000.00", 1000)).toBe(1.0);
    expect(ruleReward("#### -3.5", "-3.50")).toBe(1.0);
    expect(ruleReward("#### 18", "72")).toBe(0.0);
    expect(ruleReward("nothing", "72")).toBe(0.0);
    expect(ruleReward("#### 18", undefined)).toBe(0.0);
  });
  test("non-numeric ground truth compares text", () => {
    expect(ruleReward("#### 18", "eighteen")).toBe(0.0);
  });
});

describe("computeReward", () => {
  let server: Server<undefined>;
  let url: string;
  const seen: any[] = [];
  beforeAll(() => {
    server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      async fetch(req) {
        const raw = await req.text();
        if (!(await verifySignature("rw", req.headers.get(SIGNATURE_HEADER), raw, Date.now() / 1000))) return new Response("", { status: 401 });
        const body = JSON.parse(raw);
        seen.push(body);
        return Response.json({ score: body.final_answer.includes(String(body.ground_truth)) ? 0.75 : 0.25 });
      },
    });
    url = `http://127.0.0.1:${server.port}/score`;
  });
  afterAll(() => server.stop(true));

  const clock = () => {
    let t = 1000;
    return () => (t += 250);
  };

  test("rule style with seconds from the clock", async () => {
    expect(await computeReward({ key: "k", data_source: "gsm8k", reward_model: { style: "rule", ground_truth: "72" }, final_answer: "#### 72" }, { nowMs: clock() })).toEqual({
      score: 1.0,
      seconds: 0.25,
    });
  });
  test("rule style without ground_truth → score null with an error naming the field, never a silent 0.0", async () => {
    const error = "reward_model.ground_truth is missing: the rule reward compares the final answer with it";
    expect(await computeReward({ key: "k", data_source: "gsm8k", reward_model: { style: "rule" }, final_answer: "#### 72" }, { nowMs: clock() })).toEqual({ score: null, seconds: 0.25, error });
    expect(await computeReward({ key: "k", data_source: "gsm8k", reward_model: { ground_truth: null }, final_answer: "#### 72" }, { nowMs: clock() })).toEqual({ score: null, seconds: 0.25, error });
    // A ground truth of 0 or "" is a value, scored as usual.
    expect(await computeReward({ key: "k", data_source: "gsm8k", reward_model: { style: "rule", ground_truth: 0 }, final_answer: "#### 0" }, { nowMs: clock() })).toEqual({ score: 1.0, seconds: 0.25 });
  });
  test("no reward_model or another style → null", async () => {
    expect(await computeReward({ key: "k", data_source: "d", final_answer: "1" })).toEqual({ score: null, seconds: 0 });
    expect(await computeReward({ key: "k", data_source: "d", reward_model: { style: "model" }, final_answer: "1" })).toEqual({ score: null, seconds: 0 });
    // A style edgeloop neither scores nor leaves to the trainer (a typo) says so instead of going unscored silently.
    expect(await computeReward({ key: "k", data_source: "d", reward_model: { style: "nosuch" }, final_answer: "1" })).toEqual({
      score: null,
      seconds: 0,
      error: "reward_model.style 'nosuch' is not one edgeloop scores (rule, webhook) or leaves to the trainer (model)",
    });
  });
  test("webhook style over loopback", async () => {
    const r = await computeReward(
      { key: "u_1_0", data_source: "gsm8k", reward_model: { style: "webhook", ground_truth: 72 }, final_answer: "It is 72." },
      { webhook: { url, timeout_ms: 1000, max_retries: 0 }, secret: "rw", nowMs: clock() },
    );
    expect(r).toEqual({ score: 0.75, seconds: 0.25 });
    expect(seen.at(-1)).toEqual({ key: "u_1_0", data_source: "gsm8k", final_answer: "It is 72.", ground_truth: 72 });
  });
  test("webhook failure → null score with an error; no webhook configured → error", async () => {
    const r = await computeReward(
      { key: "k", data_source: "d", reward_model: { style: "webhook", ground_truth: 1 }, final_answer: "1" },
      { webhook: { url, timeout_ms: 1000, max_retries: 0 }, secret: "bad", nowMs: clock() },
    );
    expect(r).toEqual({ score: null, seconds: 0.25, error: `webhook ${url}: HTTP 401` });
    expect(await computeReward({ key: "k", data_source: "d", reward_model: { style: "webhook" }, final_answer: "1" }, { nowMs: clock() })).toEqual({
      score: null,
      seconds: 0.25,
      error: "reward_model.style is 'webhook' but no reward webhook is configured",
    });
  });
});
