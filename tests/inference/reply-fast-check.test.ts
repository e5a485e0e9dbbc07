import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { judgeReply, replyProblem } from "../../shared/inference/reply-check.ts";
import { surelyUsableReply } from "../../shared/inference/reply-fast-check.ts";

// The gateway settles a reply with surelyUsableReply and runs the full check (zod wire schema, then the
// engine clients' parsers) only when it says false. So "true" must never hide a problem the full check
// finds, whatever the request asked for: checked here on the recorded wire samples and on thousands of
// seeded mutations of them.

const DIR = join(import.meta.dir, "../fixtures/engines");
const PATHS: [prefix: string, path: string][] = [
  ["vllm-completion-", "/v1/completions"],
  ["vllm-generate-", "/inference/v1/generate"],
  ["sglang-generate-", "/generate"],
];

/** Request bodies per path: ids and log-probs asked for, ids only, neither. */
const REQUESTS: Record<string, unknown[]> = {
  "/v1/completions": [
    { prompt: [1, 2], max_tokens: 4, logprobs: 0, return_token_ids: true, return_tokens_as_token_ids: true },
    { prompt: [1, 2], max_tokens: 4, return_token_ids: true },
    { prompt: "hi", max_tokens: 4 },
  ],
  "/inference/v1/generate": [
    { token_ids: [1, 2], sampling_params: { max_tokens: 4, logprobs: 0 } },
    { token_ids: [1, 2], sampling_params: { max_tokens: 4 } },
  ],
  "/generate": [
    { input_ids: [1, 2], sampling_params: { max_new_tokens: 4 }, return_logprob: true },
    { input_ids: [1, 2], sampling_params: { max_new_tokens: 4 } },
    { text: "hi" },
  ],
};

interface Sample {
  name: string;
  path: string;
  body: unknown;
}

function samples(): Sample[] {
  const out: Sample[] = [];
  for (const file of readdirSync(DIR).sort()) {
    const hit = PATHS.find(([prefix]) => file.startsWith(prefix));
    if (!hit) continue;
    const f = JSON.parse(readFileSync(join(DIR, file), "utf8")) as { reply: { status: number; body: unknown } };
    if (f.reply.status >= 200 && f.reply.status < 300) out.push({ name: file.replace(/\.json$/, ""), path: hit[1], body: f.reply.body });
  }
  return out;
}

/** Problems the full check (no fast path) finds for `text`, one per request variant. */
const fullProblems = (path: string, text: string) => REQUESTS[path]!.map((req) => judgeReply(path, "application/json", text, JSON.stringify(req), false).problem);

/** Seeded PRNG (mulberry32), so every run mutates the same way. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The [parent, key] slots of a JSON value: every object field, and of each
 * array its first two and last elements (so that long arrays such as
 * `prompt_token_ids` do not soak up the mutations).
 */
function slots(v: unknown, out: [Record<string | number, unknown>, string | number][] = []): [Record<string | number, unknown>, string | number][] {
  if (Array.isArray(v)) {
    for (const i of new Set([0, 1, v.length - 1].filter((i) => i >= 0 && i < v.length))) out.push([v as never, i]), slots(v[i], out);
  } else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) out.push([v as never, k]), slots(x, out);
  return out;
}

const REPLACEMENTS: unknown[] = [null, undefined, 0, -1, 1.5, 2 ** 60, "x", "token_id:7", "token_id:007", "", [], {}, [-0.5, 5, null], true, "stop", "length", "abort", "repetition", { type: "stop" }];

/** One mutation of `body`, as JSON text: a slot replaced, deleted, an array cut or grown, or a number made huge. */
function mutate(body: unknown, r: () => number): string {
  const copy = structuredClone(body);
  const all = slots(copy);
  const n = 1 + Math.floor(r() * 3);
  for (let m = 0; m < n && all.length > 0; m++) {
    const [parent, key] = all[Math.floor(r() * all.length)]!;
    const what = r();
    if (what < 0.55) parent[key] = REPLACEMENTS[Math.floor(r() * REPLACEMENTS.length)];
    else if (what < 0.7) {
      if (Array.isArray(parent)) parent.splice(Number(key), 1);
      else delete parent[key];
    } else if (what < 0.85 && Array.isArray(parent)) parent.push(parent[Math.floor(r() * parent.length)]);
    else if (typeof parent[key] === "number") parent[key] = (parent[key] as number) + 1;
  }
  const text = JSON.stringify(copy) ?? "null";
  // JSON numbers that parse to Infinity or an unsafe integer, which no object literal above can produce.
  if (r() >= 0.15) return text;
  const numbers = [...text.matchAll(/(?<=[:,[])-?\d+(\.\d+)?(?=[,\]}])/g)];
  const hit = numbers[Math.floor(r() * numbers.length)];
  return hit ? text.slice(0, hit.index) + (r() < 0.5 ? "1e400" : "9007199254740993") + text.slice(hit.index + hit[0].length) : text;
}

describe("surelyUsableReply", () => {
  const all = samples();

  test("the recorded 2xx samples: usable ones are settled fast, the rest go to the full check", () => {
    const verdicts = Object.fromEntries(all.map((s) => [s.name, surelyUsableReply(s.path, s.body)]));
    expect(verdicts).toEqual({
      "sglang-generate-abort-empty": false,
      "sglang-generate-abort-partial": true,
      "sglang-generate-ids-in-logprobs-only": true,
      "sglang-generate-length": true,
      "sglang-generate-no-ids": false,
      "sglang-generate-stop": true,
      "vllm-completion-abort-empty": false,
      "vllm-completion-abort-partial": true,
      "vllm-completion-length": true,
      "vllm-completion-logprobs-misaligned": false,
      "vllm-completion-no-ids": false,
      "vllm-completion-token-id-strings": true,
      "vllm-completion-token-ids": true,
      "vllm-generate-tokens": true,
      "vllm-generate-tokens-main": true,
    });
    // Whatever was asked, the full check agrees that the fast-settled ones are usable.
    for (const s of all) if (verdicts[s.name]) expect(fullProblems(s.path, JSON.stringify(s.body))).toEqual(REQUESTS[s.path]!.map(() => null));
    // And a problem it finds in the others is still found (the gateway words it from the full check).
    const noIds = all.find((s) => s.name === "vllm-completion-no-ids")!;
    expect(fullProblems(noIds.path, JSON.stringify(noIds.body))[0]).toStartWith("no token ids: choices[0].token_ids is missing");
  });

  test("other paths and shapes are never settled fast", () => {
    expect(surelyUsableReply("/v1/models", { data: [] })).toBe(false);
    expect(surelyUsableReply("/v1/chat/completions", { choices: [] })).toBe(false);
    expect(surelyUsableReply("/generate", [])).toBe(false);
    expect(surelyUsableReply("/v1/completions", [])).toBe(false);
    expect(surelyUsableReply("/v1/completions", "text")).toBe(false);
    expect(surelyUsableReply("/v1/completions", null)).toBe(false);
  });

  test("an SGLang batch is settled only when every item is", () => {
    const ok = all.find((s) => s.name === "sglang-generate-stop")!.body;
    const bad = all.find((s) => s.name === "sglang-generate-no-ids")!.body;
    expect(surelyUsableReply("/generate", [ok, ok])).toBe(true);
    expect(surelyUsableReply("/generate", [ok, bad])).toBe(false);
    expect(surelyUsableReply("/generate", [ok, [ok]])).toBe(false);
  });

  test("ids spelled as token_id strings must agree with token_ids, in any spelling", () => {
    const base = all.find((s) => s.name === "vllm-completion-token-ids")!.body as { choices: Record<string, any>[] };
    const withTokens = (tokens: string[]) => ({ ...base, choices: [{ ...base.choices[0], logprobs: { ...base.choices[0]!.logprobs, tokens } }] });
    expect(surelyUsableReply("/v1/completions", withTokens(["token_id:12095", "token_id:13", "token_id:151645"]))).toBe(true);
    // Zero-padded: the same ids read the general way.
    expect(surelyUsableReply("/v1/completions", withTokens(["token_id:012095", "token_id:13", "token_id:151645"]))).toBe(true);
    // Not all in the token_id form: no ids from strings, token_ids alone decide.
    expect(surelyUsableReply("/v1/completions", withTokens([" Paris", ".", "<|im_end|>"]))).toBe(true);
    const disagree = withTokens(["token_id:12095", "token_id:14", "token_id:151645"]);
    expect(surelyUsableReply("/v1/completions", disagree)).toBe(false);
    expect(replyProblem("/v1/completions", "application/json", JSON.stringify(disagree), JSON.stringify(REQUESTS["/v1/completions"]![0]))).toBe(
      "choices[0].token_ids disagree with the ids in logprobs.tokens",
    );
  });

  test("20,000 seeded mutations: whenever the fast check says usable, the full check finds no problem for any request", () => {
    const r = rng(20261201);
    let fast = 0;
    let slow = 0;
    for (let i = 0; i < 20_000; i++) {
      const s = all[i % all.length]!;
      const text = mutate(s.body, r);
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        continue;
      }
      if (surelyUsableReply(s.path, body)) {
        fast++;
        const problems = fullProblems(s.path, text);
        if (problems.some((p) => p !== null)) throw new Error(`${s.name}: fast check passed ${text} but the full check says ${JSON.stringify(problems)}`);
      } else slow++;
    }
    // Both sides are exercised.
    expect(fast).toBeGreaterThan(500);
    expect(slow).toBeGreaterThan(500);
  });
});
