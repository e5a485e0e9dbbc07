import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fastVllmCompletionReply, fastVllmGenerateReply, VllmCompletionReply, VllmGenerateReply } from "../../shared/inference/vllm-wire.ts";
import { parseCompletionReply } from "../../shared/inference/vllm-client.ts";
import { fastSglangGenerateReply, parseSglangReply, SglangGenerateReply } from "../../shared/inference/sglang-client.ts";

const DIR = join(import.meta.dir, "..", "fixtures", "engines");
const bodies = (prefix: string) =>
  readdirSync(DIR)
    .filter((f) => f.startsWith(prefix))
    .map((f) => [f, JSON.parse(readFileSync(join(DIR, f), "utf8")).reply.body] as const);

/** Every variant of `body` with one field replaced by a value of another type (or removed). */
function mutations(body: unknown): unknown[] {
  const out: unknown[] = [];
  const values = [null, undefined, -1, 1.5, Infinity, "x", [], {}, [1, "a"], [-2], [null], true];
  const walk = (v: unknown, set: (x: unknown) => unknown) => {
    if (Array.isArray(v)) {
      v.slice(0, 2).forEach((e, i) => walk(e, (x) => set(v.map((y, j) => (j === i ? x : y)))));
      for (const x of values) out.push(set(x));
    } else if (v !== null && typeof v === "object") {
      for (const k of Object.keys(v)) walk((v as Record<string, unknown>)[k], (x) => set({ ...(v as object), [k]: x }));
      for (const x of values) out.push(set(x));
    } else for (const x of values) out.push(set(x));
  };
  walk(body, (x) => x);
  return out;
}

describe("engine reply fast paths: accept only what zod accepts, with the same data", () => {
  for (const [schema, fast, prefix] of [
    [VllmCompletionReply, fastVllmCompletionReply, "vllm-completion-"],
    [VllmGenerateReply, fastVllmGenerateReply, "vllm-generate-"],
    [SglangGenerateReply, fastSglangGenerateReply, "sglang-generate-"],
  ] as const) {
    test(`${prefix}* recorded replies and every one-field mutation of them`, () => {
      let accepted = 0;
      let checked = 0;
      for (const [, body] of bodies(prefix)) {
        for (const b of [body, ...mutations(body)]) {
          checked++;
          const f = (fast as (x: unknown) => unknown)(b);
          const z = (schema as { safeParse: (x: unknown) => { success: boolean; data?: unknown } }).safeParse(b);
          if (f !== undefined) {
            accepted++;
            expect(z.success).toBe(true);
            expect(f).toEqual(z.data as never);
          }
        }
      }
      // The recorded 2xx replies themselves take the fast path.
      expect(accepted).toBeGreaterThan(bodies(prefix).length);
      expect(checked).toBeGreaterThan(100);
    });
  }

  test("a reply zod rejects keeps zod's message", () => {
    const [, body] = bodies("vllm-completion-token-ids")[0]!;
    const bad = { ...body, choices: [{ ...body.choices[0], token_ids: [12095, -1, 151645] }] };
    expect(fastVllmCompletionReply(bad)).toBeUndefined();
    expect(() => parseCompletionReply("http://e/v1/completions", bad, true)).toThrow(
      "engine at http://e/v1/completions sent an unusable reply: not a completion reply (choices.0.token_ids.1: Too small: expected number to be >=0)",
    );
    expect(parseCompletionReply("http://e/v1/completions", body, true)).toEqual({
      token_ids: [12095, 13, 151645],
      log_probs: [-0.0123, -0.51, -0.002],
      finish_reason: "stop",
      stop_reason: 151645,
      num_preempted: -1,
      cached_tokens: 12,
      extra_fields: {},
    } as never);
  });
});

test("SGLang: a bad triple keeps zod's message; a good reply parses as before", () => {
  const [, body] = bodies("sglang-generate-stop")[0]!;
  const lps = body.meta_info.output_token_logprobs as unknown[][];
  const bad = { ...body, meta_info: { ...body.meta_info, output_token_logprobs: [lps[0], [lps[1]![0], -5, null], ...lps.slice(2)] } };
  expect(fastSglangGenerateReply(bad)).toBeUndefined();
  expect(() => parseSglangReply("http://e/generate", bad, true)).toThrow(
    "engine at http://e/generate sent an unusable reply: not a /generate reply (meta_info.output_token_logprobs.1.1: Too small: expected number to be >=0)",
  );
  expect(fastSglangGenerateReply(body)).toBe(body);
  const out = parseSglangReply("http://e/generate", body, true);
  expect(out.token_ids).toEqual(body.output_ids);
  expect(out.log_probs).toEqual(lps.map((t) => t[0]) as number[]);
});
