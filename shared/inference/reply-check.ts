import type { z } from "zod";
import { BadEngineResponseError } from "../errors.ts";
import { parseSglangReply, SglangGenerateReply } from "./sglang-client.ts";
import { surelyUsableReply } from "./reply-fast-check.ts";
import { parseCompletionReply, parseGenerateReply } from "./vllm-client.ts";
import { ModelsReply, VllmCompletionReply, VllmGenerateReply } from "./vllm-wire.ts";

/** The wire schema of a 2xx reply, by request path (the engine endpoints edgeloop proxies). */
const SCHEMAS: Record<string, z.ZodType> = {
  "/v1/completions": VllmCompletionReply,
  "/inference/v1/generate": VllmGenerateReply,
  "/generate": SglangGenerateReply,
  "/v1/models": ModelsReply,
};

/** What a token-in request asked the engine to send back. */
export interface ReplyWants {
  /** The reply must carry the sampled token ids (or ids recoverable from `token_id:<id>` strings). */
  ids: boolean;
  /** The reply must carry one finite log-prob per sampled token. */
  logprobs: boolean;
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * What a request body asks of the reply, by endpoint, or null when the body
 * is not a JSON object or the path is not a generation endpoint:
 * - vLLM `/v1/completions`: ids when `return_token_ids: true` (or
 *   `return_tokens_as_token_ids: true` with `logprobs` set); log-probs when
 *   `logprobs` is a number.
 * - vLLM `/inference/v1/generate` (tokens in, tokens out): ids always;
 *   log-probs when `sampling_params.logprobs` is a number.
 * - SGLang `/generate`: ids when the prompt is `input_ids`; log-probs when
 *   `return_logprob: true`.
 * @see docs/engines.md §2.2, §2.5, §3.1
 */
export function replyWants(path: string, requestText: string | undefined): ReplyWants | null {
  if (!requestText) return null;
  let req: unknown;
  try {
    req = JSON.parse(requestText);
  } catch {
    return null;
  }
  if (!isObj(req)) return null;
  if (path === "/v1/completions") {
    const lp = typeof req.logprobs === "number";
    return { ids: req.return_token_ids === true || (req.return_tokens_as_token_ids === true && lp), logprobs: lp };
  }
  if (path === "/inference/v1/generate") {
    const sp = isObj(req.sampling_params) ? req.sampling_params : {};
    return { ids: true, logprobs: typeof sp.logprobs === "number" };
  }
  if (path === "/generate") return { ids: req.input_ids !== undefined, logprobs: req.return_logprob === true };
  return null;
}

/**
 * The content problem of one parsed 2xx reply judged by the engine clients'
 * own parsers (`parseCompletionReply`, `parseGenerateReply`,
 * `parseSglangReply`: ids present and agreeing, one finite log-prob per id
 * when asked, a known finish reason), or null when usable. Every choice of a
 * multi-choice reply and every item of an SGLang batch is checked. An abort
 * before any token is a usable reply (the engine said so; the client resumes).
 */
function contentProblem(path: string, body: unknown, wants: ReplyWants): string | null {
  if (!wants.ids) return null;
  const check = (fn: () => unknown): string | null => {
    try {
      fn();
      return null;
    } catch (e) {
      if (e instanceof BadEngineResponseError) return e.message.replace(`engine at ${path} sent an unusable reply: `, "");
      return null;
    }
  };
  if (path === "/generate") {
    for (const item of Array.isArray(body) ? body : [body]) {
      const p = check(() => parseSglangReply(path, item, wants.logprobs));
      if (p) return p;
    }
    return null;
  }
  const parse = path === "/v1/completions" ? parseCompletionReply : parseGenerateReply;
  const choices = isObj(body) && Array.isArray(body.choices) ? body.choices : [];
  for (let i = 0; i < choices.length; i++) {
    const p = check(() => parse(path, { ...(body as object), choices: [choices[i]] }, wants.logprobs));
    if (p) return i === 0 ? p : p.replaceAll("choices[0]", `choices[${i}]`);
  }
  return null;
}

/**
 * What is wrong with a replica's 2xx reply to `path`, or null when it is
 * usable: a body that is not JSON, JSON that does not match the engine's
 * wire schema for that endpoint (vLLM `/v1/completions`,
 * `/inference/v1/generate`, SGLang `/generate` — a single reply or a batch
 * array —, `/v1/models`), or, when `requestText` (the request body) asked
 * for them (see {@link replyWants}), a reply without the token ids or
 * log-probs the engine clients need — judged by the clients' own parsers, so
 * the gateway fails over exactly the replies a client would reject. An event
 * stream is not checked here (its chunks are relayed as they come); other
 * paths only need JSON when they say so in `content-type`.
 * @see docs/engines.md §2.3, §2.5, §3.2
 */
export function replyProblem(path: string, contentType: string | null, text: string, requestText?: string): string | null {
  return judgeReply(path, contentType, text, requestText).problem;
}

/** What {@link judgeReply} found: the reply's problem, and its body parsed once (for the caller's other uses). */
export interface ReplyVerdict {
  /** What is wrong with the reply, or null when it is usable (see {@link replyProblem}). */
  problem: string | null;
  /** Whether the body was parsed as JSON (false: an event stream, a non-JSON path, or a body that is not JSON). */
  parsed: boolean;
  /** The parsed body when `parsed`, else undefined. */
  json: unknown;
}

/**
 * {@link replyProblem}, plus the parsed body, for a caller that has the
 * request only as a thunk: the request is decoded and parsed only when the
 * reply's verdict depends on what was asked. The common case — a
 * well-formed generation reply carrying token ids and one finite log-prob
 * per id — is settled by {@link surelyUsableReply} without zod and without
 * reading the request; anything else takes the full check (wire schema,
 * then the clients' parsers), which words the problem. `settleFast: false`
 * skips that shortcut (tests hold the two paths to one verdict with it).
 */
export function judgeReply(
  path: string,
  contentType: string | null,
  text: string,
  request?: string | (() => string | undefined),
  settleFast = true,
): ReplyVerdict {
  const ct = (contentType ?? "").toLowerCase();
  if (ct.includes("text/event-stream")) return { problem: null, parsed: false, json: undefined };
  const schema = SCHEMAS[path];
  if (!schema && !ct.includes("json")) return { problem: null, parsed: false, json: undefined };
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return { problem: `body is not JSON (${JSON.stringify(text.slice(0, 60))})`, parsed: false, json: undefined };
  }
  if (!schema || (settleFast && surelyUsableReply(path, body))) return { problem: null, parsed: true, json: body };
  const items = path === "/generate" && Array.isArray(body) ? body : [body];
  for (const item of items) {
    const r = schema.safeParse(item);
    if (!r.success) {
      const i = r.error.issues[0];
      return { problem: `not a ${path} reply (${i?.path.join(".") || "body"}: ${i?.message})`, parsed: true, json: body };
    }
  }
  const wants = replyWants(path, typeof request === "function" ? request() : request);
  return { problem: wants ? contentProblem(path, body, wants) : null, parsed: true, json: body };
}
