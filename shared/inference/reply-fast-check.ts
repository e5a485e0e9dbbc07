import { idsFromTokenIdStrings } from "./vllm-wire.ts";

/**
 * A sufficient, zod-free test that a parsed 2xx generation reply is usable
 * whatever its request asked for: the gateway's hot path. `true` promises
 * that the full check (`replyProblem`: the endpoint's zod wire schema, then
 * the engine clients' own parsers with token ids *and* log-probs wanted)
 * finds no problem; `false` promises nothing — the caller then runs the full
 * check, which names the problem (or finds none, e.g. a reply without
 * log-probs to a request that did not ask for them). Every test here is at
 * least as strict as the schema's or the parser's (finite numbers, safe
 * integers, known finish reasons), so the full check decides every doubtful
 * case; a differential test holds the two together
 * (tests/inference/reply-fast-check.test.ts).
 *
 * Paths: vLLM `/v1/completions` and `/inference/v1/generate`, SGLang
 * `/generate` (one reply or a non-empty batch array); any other path → `false`.
 * Never throws.
 * @see ./reply-check.ts (`replyProblem`), ./vllm-wire.ts, ./sglang-client.ts (`SglangGenerateReply`, `parseSglangReply`), ./finish-output.ts
 */
export function surelyUsableReply(path: string, body: unknown): boolean {
  if (path === "/v1/completions") return vllmReplyOk(body, completionChoiceOk);
  if (path === "/inference/v1/generate") return vllmReplyOk(body, generateChoiceOk);
  if (path === "/generate") {
    if (!Array.isArray(body)) return sglangItemOk(body);
    if (body.length === 0) return false;
    for (const item of body) if (!sglangItemOk(item)) return false;
    return true;
  }
  return false;
}

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const absent = (v: unknown): v is null | undefined => v === undefined || v === null;
const optString = (v: unknown) => absent(v) || typeof v === "string";
const optInt = (v: unknown) => absent(v) || Number.isSafeInteger(v);
const optCount = (v: unknown) => absent(v) || (Number.isSafeInteger(v) && (v as number) >= 0);
const optStopReason = (v: unknown) => absent(v) || typeof v === "string" || Number.isFinite(v);
const isTokenId = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;

/** A token-id array (safe integers ≥ 0), or undefined when `v` is not one. */
function idArray(v: unknown): readonly number[] | undefined {
  if (!Array.isArray(v)) return undefined;
  for (const x of v) if (!isTokenId(x)) return undefined;
  return v as number[];
}

/** `ids` non-empty, or a finish reason other than abort; and one finite log-prob per id. */
function endOk(ids: readonly number[], finish: unknown, logprobCount: number, logprobAt: (i: number) => unknown): boolean {
  if (finish !== "stop" && finish !== "length" && finish !== "repetition" && !(finish === "abort" && ids.length > 0)) return false;
  if (logprobCount !== ids.length) return false;
  for (let i = 0; i < logprobCount; i++) if (!Number.isFinite(logprobAt(i))) return false;
  return true;
}

/**
 * Whether `items` spell `ids` exactly as `"token_id:<id>"` strings (vLLM's
 * `return_tokens_as_token_ids` form): then the ids read from them are `ids`,
 * without a regular expression per token. Any other spelling → false (the
 * caller reads the strings the general way).
 */
function spellsIds<T>(items: readonly T[], ids: readonly number[], token: (item: T) => unknown): boolean {
  if (items.length !== ids.length) return false;
  for (let i = 0; i < ids.length; i++) if (!spellsId(token(items[i]!), ids[i]!)) return false;
  return true;
}

/** `t` is `"token_id:"` and 1–15 digits whose value is `id` (no string built per token; 15 digits stay exact in a double). */
function spellsId(t: unknown, id: number): boolean {
  if (typeof t !== "string" || t.length < 10 || t.length > 24 || !t.startsWith("token_id:")) return false;
  let v = 0;
  for (let k = 9; k < t.length; k++) {
    const d = t.charCodeAt(k) - 48;
    if (d < 0 || d > 9) return false;
    v = v * 10 + d;
  }
  return v === id;
}

const sameIds = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((v, i) => v === b[i]);

/** The fields shared by both vLLM replies (`usage`, `choices` non-empty), then every choice. */
function vllmReplyOk(body: unknown, choiceOk: (c: Obj) => boolean): boolean {
  if (!isObj(body)) return false;
  if (!optString(body.id) || !optString(body.request_id)) return false;
  const usage = body.usage;
  if (!absent(usage)) {
    if (!isObj(usage) || !optInt(usage.prompt_tokens) || !optInt(usage.completion_tokens)) return false;
    const details = usage.prompt_tokens_details;
    if (!absent(details) && (!isObj(details) || !optCount(details.cached_tokens))) return false;
  }
  const choices = body.choices;
  if (!Array.isArray(choices) || choices.length === 0) return false;
  for (const c of choices) {
    if (!isObj(c) || !optInt(c.index) || !optString(c.finish_reason) || !optStopReason(c.stop_reason)) return false;
    if (!choiceOk(c)) return false;
  }
  return true;
}

/** `/v1/completions` choice: ids in `token_ids` or `"token_id:<id>"` strings (agreeing when both), `logprobs.token_logprobs`. */
function completionChoiceOk(c: Obj): boolean {
  if (!optString(c.text)) return false;
  const tokenIds = absent(c.token_ids) ? undefined : idArray(c.token_ids);
  if (!absent(c.token_ids) && !tokenIds) return false;
  const lp = c.logprobs;
  if (!isObj(lp)) return false;
  const tokens = lp.tokens;
  let fromStrings: readonly number[] | undefined;
  if (!absent(tokens)) {
    if (!Array.isArray(tokens)) return false;
    for (const t of tokens) if (typeof t !== "string") return false;
    fromStrings = tokenIds && spellsIds(tokens, tokenIds, (t) => t) ? tokenIds : idsFromTokenIdStrings(tokens as string[]);
    if (fromStrings && !fromStrings.every(isTokenId)) return false;
  }
  const ids = tokenIds ?? fromStrings;
  if (!ids || (tokenIds && fromStrings && !sameIds(tokenIds, fromStrings))) return false;
  const lps = lp.token_logprobs;
  if (!Array.isArray(lps)) return false;
  return endOk(ids, c.finish_reason, lps.length, (i) => lps[i]);
}

/** `/inference/v1/generate` choice: ids in `token_ids` or the `logprobs.content[].token` strings (vLLM main: `token_id` numbers, which must agree), `logprobs.content[].logprob`. */
function generateChoiceOk(c: Obj): boolean {
  const tokenIds = absent(c.token_ids) ? undefined : idArray(c.token_ids);
  if (!absent(c.token_ids) && !tokenIds) return false;
  const lp = c.logprobs;
  if (!isObj(lp)) return false;
  const content = lp.content;
  if (!Array.isArray(content)) return false;
  for (const e of content) if (!isObj(e) || !optString(e.token) || !optCount(e.token_id) || !Number.isFinite(e.logprob)) return false;
  const fromStrings =
    tokenIds && spellsIds(content, tokenIds, (e) => (e as Obj).token)
      ? tokenIds
      : idsFromTokenIdStrings(content.map((e) => (e as Obj).token as string | null | undefined));
  if (fromStrings && !fromStrings.every(isTokenId)) return false;
  const ids = tokenIds ?? fromStrings;
  if (!ids || (tokenIds && fromStrings && !sameIds(tokenIds, fromStrings))) return false;
  // vLLM main names each entry's id (`token_id`): when every entry does, they must be the ids.
  if (content.length > 0 && content.every((e) => typeof (e as Obj).token_id === "number") && !(content.length === ids.length && content.every((e, i) => (e as Obj).token_id === ids[i]))) return false;
  // The generate endpoint's missing finish reason means "stop" (as the server and the client read it).
  return endOk(ids, c.finish_reason ?? "stop", content.length, (i) => (content[i] as Obj).logprob);
}

/** One SGLang `/generate` reply: ids in `output_ids`, `token_ids` or the log-prob triples (agreeing), one triple per id. */
function sglangItemOk(item: unknown): boolean {
  if (!isObj(item) || !optString(item.text)) return false;
  const out = absent(item.output_ids) ? undefined : idArray(item.output_ids);
  if (!absent(item.output_ids) && !out) return false;
  const alt = absent(item.token_ids) ? undefined : idArray(item.token_ids);
  if (!absent(item.token_ids) && !alt) return false;
  const meta = item.meta_info;
  if (!isObj(meta)) return false;
  if (!optString(meta.id) || !optInt(meta.prompt_tokens) || !optInt(meta.completion_tokens) || !optCount(meta.cached_tokens)) return false;
  if (!optString(meta.weight_version) || !optString(meta.routed_experts)) return false;
  const fr = meta.finish_reason;
  if (!isObj(fr) || typeof fr.type !== "string" || !optStopReason(fr.matched) || !optString(fr.message)) return false;
  const triples = meta.output_token_logprobs;
  if (!Array.isArray(triples)) return false;
  for (const t of triples) if (!Array.isArray(t) || t.length < 2 || !Number.isFinite(t[0]) || !isTokenId(t[1])) return false;
  const ids = out ?? alt;
  if (ids) {
    if (ids.length !== triples.length) return false;
    for (let i = 0; i < ids.length; i++) if ((triples[i] as unknown[])[1] !== ids[i]) return false;
  }
  const n = triples.length;
  return endOk(ids ?? new Array<number>(n), fr.type, n, (i) => (triples[i] as unknown[])[0]);
}
