import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BadEngineResponseError, TeacherError } from "../../shared/errors.ts";
import { createTeacherClient, teacherScoreBody, type TeacherFormat } from "../../shared/inference/teacher-client.ts";
import { scoreWithTeacher, withTeacherLogProbs } from "../../shared/rollout/teacher-scoring.ts";
import { loopOutputs } from "../../shared/agent-loop/registry.ts";
import type { AgentLoopOutput, TeacherConfig } from "../../shared/schema/index.ts";

// A short tool trajectory: prompt P (3 ids) ‖ A1 (2 sampled) ‖ O1 (2 observation ids, mask 0) ‖ A2 (1 sampled).
// Positions of prompt ‖ response:    0    1    2 |  3    4 |   5    6 |  7
const PROMPT = [151644, 872, 198];
const RESPONSE = [9707, 151645, 198, 151644, 22];
const MASK: (0 | 1)[] = [1, 1, 0, 0, 1];
const IDS = [...PROMPT, ...RESPONSE];
/** The fake teacher's log-prob of position j: −j/8 (exact in float32), so a shifted offset shows at once. */
const lpAt = (j: number) => -j / 8;
// Hand-computed: response positions 3..7 → −3/8, −4/8, (mask 0), (mask 0), −7/8.
const EXPECTED = [-0.375, -0.5, 0, 0, -0.875];

const output = (): AgentLoopOutput => ({
  prompt_ids: PROMPT,
  response_ids: RESPONSE,
  response_mask: MASK,
  response_logprobs: [-1, -2, 0, 0, -3],
  reward_score: 1,
  num_turns: 4,
  truncated: false,
  finish_reason: "stop",
  metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
  extra_fields: {},
});

/** What the fake answers: vLLM `prompt_logprobs` (a decoy top-1 token beside the prompt token), SGLang `input_token_logprobs`. */
type Mode = "ok" | "sglang-old" | "sglang-shifted" | "vllm-missing-token" | "fail";
let mode: Mode = "ok";
const seen: { path: string; body: Record<string, unknown>; headers: Record<string, string> }[] = [];

function vllmList(ids: number[]) {
  return ids.map((id, j) => (j === 0 ? null : { "99999": { logprob: -0.01, rank: 1, decoded_token: "x" }, ...(mode === "vllm-missing-token" && j === 4 ? {} : { [String(id)]: { logprob: lpAt(j), rank: 2, decoded_token: "t" } }) }));
}

const server = Bun.serve({
  port: 0,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    const body = (await req.json()) as Record<string, unknown>;
    seen.push({ path, body, headers: Object.fromEntries(req.headers) });
    if (mode === "fail") return Response.json({ error: { message: "teacher down", code: 500 } }, { status: 500 });
    if (path === "/v1/completions") {
      const ids = body.prompt as number[];
      return Response.json({ choices: [{ index: 0, text: "!", finish_reason: "length", prompt_logprobs: vllmList(ids) }] });
    }
    if (path === "/inference/v1/generate") {
      const ids = body.token_ids as number[];
      return Response.json({ request_id: "r", choices: [{ index: 0, finish_reason: "length", token_ids: [5] }], prompt_logprobs: vllmList(ids) });
    }
    if (path === "/generate") {
      const ids = body.input_ids as number[];
      const L = body.logprob_start_len as number;
      // Current SGLang: positions L…n−1, the first with a null log-prob; old builds: L+1…n−1, no null.
      const from = mode === "sglang-old" ? L + 1 : L;
      const entries = ids.slice(from).map((id, k) => [k === 0 && mode !== "sglang-old" ? null : lpAt(from + k), mode === "sglang-shifted" ? ids[from + k - 1] ?? id : id, null]);
      return Response.json({ text: "", output_ids: [], meta_info: { id: "r", finish_reason: { type: "length", length: 0 }, input_token_logprobs: entries } });
    }
    return Response.json({ detail: "Not Found" }, { status: 404 });
  },
});
const url = `http://127.0.0.1:${server.port}`;
afterAll(() => server.stop(true));
beforeAll(() => {
  mode = "ok";
});

const client = (format: TeacherFormat) => createTeacherClient({ url, format, model: "teacher-8b", timeoutMs: 5_000, retry: { retries: 0 } });

describe("teacher scoring wire forms and offsets", () => {
  test("request bodies: vLLM max_tokens 1 + prompt_logprobs 1; SGLang max_new_tokens 0 + logprob_start_len = prompt length − 1", () => {
    expect(teacherScoreBody("vllm", IDS, 3, "rq", "teacher-8b")).toEqual({
      path: "/v1/completions",
      body: { model: "teacher-8b", prompt: IDS, max_tokens: 1, temperature: 1, prompt_logprobs: 1, skip_special_tokens: false, n: 1, stream: false, request_id: "rq" },
    });
    expect(teacherScoreBody("vllm-generate", IDS, 3, "rq")).toEqual({
      path: "/inference/v1/generate",
      body: { request_id: "rq", token_ids: IDS, sampling_params: { max_tokens: 1, temperature: 1, prompt_logprobs: 1, skip_special_tokens: false, detokenize: false }, stream: false },
    });
    expect(teacherScoreBody("sglang", IDS, 3, "rq")).toEqual({
      path: "/generate",
      body: { input_ids: IDS, sampling_params: { max_new_tokens: 0, temperature: 1 }, return_logprob: true, logprob_start_len: 2, top_logprobs_num: 0, return_text_in_logprobs: false, stream: false, rid: "rq" },
    });
  });

  for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
    test(`${format}: entry j scores ids[j]; response positions 3…7 → hand-computed teacher_log_probs, 0.0 under mask 0`, async () => {
      mode = "ok";
      seen.length = 0;
      const scores = await client(format).score({ request_id: "req-1", routing_key: "u1_0_0", prompt_ids: PROMPT, response_ids: RESPONSE });
      expect(scores).toEqual([-0.375, -0.5, -0.625, -0.75, -0.875]);
      expect(withTeacherLogProbs(output(), scores).teacher_log_probs).toEqual(EXPECTED);
      expect(seen).toHaveLength(1);
      expect(seen[0]!.headers["x-session-id"]).toBe("u1_0_0");
      expect(seen[0]!.headers["x-request-id"]).toBe("req-1");
    });
  }

  test("sglang: an older build's entries (L+1…n−1, no null) align the same way (from the end)", async () => {
    mode = "sglang-old";
    expect(await client("sglang").score({ request_id: "r", routing_key: "k", prompt_ids: PROMPT, response_ids: RESPONSE })).toEqual([-0.375, -0.5, -0.625, -0.75, -0.875]);
  });

  test("an off-by-one reply is refused, never recorded: SGLang ids shifted by one, a vLLM entry without its token", async () => {
    mode = "sglang-shifted";
    const e1 = await client("sglang").score({ request_id: "r", routing_key: "k", prompt_ids: PROMPT, response_ids: RESPONSE }).catch((e) => e);
    expect(e1).toBeInstanceOf(BadEngineResponseError);
    expect((e1 as Error).message).toBe(`engine at ${url}/generate sent an unusable reply: input_token_logprobs[0] names token ${IDS[1]}, the input has ${IDS[2]} at position 2`);
    mode = "vllm-missing-token";
    const e2 = await client("vllm").score({ request_id: "r", routing_key: "k", prompt_ids: PROMPT, response_ids: RESPONSE }).catch((e) => e);
    expect(e2).toBeInstanceOf(BadEngineResponseError);
    expect((e2 as Error).message).toBe(`engine at ${url}/v1/completions sent an unusable reply: prompt_logprobs[4] has no log-prob for token ${IDS[4]}`);
  });

  test("scoreWithTeacher: on_error fail throws a TeacherError naming the teacher; keep records extra_fields.teacher_error and no teacher_log_probs", async () => {
    mode = "fail";
    const cfg = (on_error: "fail" | "keep"): TeacherConfig => ({ url, format: "vllm", model: null, timeout_ms: 5_000, on_error });
    const clients = () => client("vllm");
    const e = await scoreWithTeacher([output()], { teacher: cfg("fail"), clients, key: "u1_0_0" }).catch((x) => x);
    expect(e).toBeInstanceOf(TeacherError);
    expect((e as TeacherError).code).toBe("teacher_error");
    expect((e as Error).message).toBe(`rollout.teacher (vllm at ${url}) could not score output 0: engine at ${url}/v1/completions answered HTTP 500: teacher down`);
    const [kept] = await scoreWithTeacher([output()], { teacher: cfg("keep"), clients, key: "u1_0_0" });
    expect("teacher_log_probs" in kept!).toBe(false);
    expect(kept!.extra_fields.teacher_error).toBe(`rollout.teacher (vllm at ${url}) could not score output 0: engine at ${url}/v1/completions answered HTTP 500: teacher down`);
    mode = "ok";
    const [scored] = await scoreWithTeacher([output()], { teacher: cfg("fail"), clients, key: "u1_0_0" });
    expect(scored!.teacher_log_probs).toEqual(EXPECTED);
    // Already scored (read back from a checkpoint): not sent again.
    seen.length = 0;
    expect((await scoreWithTeacher([scored!], { teacher: cfg("fail"), clients, key: "u1_0_0" }))[0]).toBe(scored!);
    expect(seen).toHaveLength(0);
    // No teacher configured: outputs untouched, no call.
    expect(await scoreWithTeacher([output()], { teacher: null, clients, key: "k" })).toEqual([output()]);
    expect(seen).toHaveLength(0);
  });

  test("teacher values are rounded to float32 on sampled tokens (as the queue stores them)", () => {
    expect(withTeacherLogProbs(output(), [-0.1, -0.2, -5, -6, -0.3]).teacher_log_probs).toEqual([Math.fround(-0.1), Math.fround(-0.2), 0, 0, Math.fround(-0.3)]);
  });

  test("a loop cannot set teacher_log_probs itself: loopOutputs drops them (only the teacher call sets them)", () => {
    const [o] = loopOutputs("custom", { ...output(), teacher_log_probs: [-1, -1, -1, -1, -1] });
    expect("teacher_log_probs" in o!).toBe(false);
    expect(o!.response_ids).toEqual(RESPONSE);
  });
});
