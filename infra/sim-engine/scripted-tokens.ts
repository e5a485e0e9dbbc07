import { fnv1a32, hashInt, unitFloat } from "../../shared/inference/hash.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { familyText } from "./family-text.ts";
import type { SimLengths, SimTurn } from "./script.ts";
import type { SimMoe } from "./sim-types.ts";

// What the simulated engine generates, as pure functions of the tokenizer and the script seed: a scripted
// turn's ids, an unscripted turn's drawn length, stop strings, log-probs and routed experts.

/** A scripted turn's ids and nominal finish reason. */
export function turnTokens(tokenizer: ChatTokenizer, turn: SimTurn, stopIds: readonly number[] = []): { ids: number[]; finish: "stop" | "length" | "abort" } {
  const eos = tokenizer.eosTokenId;
  // A family text that already ends with a stop id (harmony's <|call|>/<|return|>) gets no eos after it.
  const closed = (ids: number[]) => (tokenizer.isStopToken(ids.at(-1)) ? ids : [...ids, eos]);
  if (typeof turn === "string") return { ids: closed(tokenizer.encode(familyText(tokenizer, turn))), finish: "stop" };
  if ("text" in turn) {
    const finish = turn.finish_reason ?? "stop";
    const ids = tokenizer.encode(familyText(tokenizer, turn.text));
    return { ids: finish === "stop" ? closed(ids) : ids, finish };
  }
  const last = turn.token_ids[turn.token_ids.length - 1];
  const ends = last !== undefined && (tokenizer.isStopToken(last) || stopIds.includes(last));
  return { ids: [...turn.token_ids], finish: turn.finish_reason ?? (ends ? "stop" : "length") };
}

/**
 * An unscripted turn at the length drawn for it (script `lengths`, see
 * {@link SimLengths}): its ids without the closing stop id, repeated to
 * L − 1 tokens (or `newline` repeated, for a turn with none), then the model's end id; `finish` stop.
 */
export function stretchTurn(tokenizer: ChatTokenizer, newline: readonly number[], seed: number, ids: number[], lengths: SimLengths, key: string, turnIndex: number): { ids: number[]; finish: "stop" } {
  const L = drawLength(lengths, seed, key, turnIndex);
  const body = ids.length > 0 && tokenizer.isStopToken(ids[ids.length - 1]) ? ids.slice(0, -1) : ids;
  const src = body.length > 0 ? body : newline;
  const out: number[] = new Array(L);
  for (let i = 0; i < L - 1; i++) out[i] = src[i % src.length]!;
  out[L - 1] = tokenizer.eosTokenId;
  return { ids: out, finish: "stop" };
}

/**
 * The length (tokens, end id included) of an unscripted turn under
 * `lengths`: lognormal by Box–Muller over two uniforms hashed from (seed,
 * key, turn index), clamped to `min..max`.
 */
export function drawLength(lengths: SimLengths, seed: number, key: string, turnIndex: number): number {
  const h = hashInt(hashInt(fnv1a32(key), seed), turnIndex);
  const u1 = unitFloat(hashInt(h, 1));
  const u2 = unitFloat(hashInt(h, 2));
  const z = Math.sqrt(-2 * Math.log(1 - u1)) * Math.cos(2 * Math.PI * u2);
  return Math.min(lengths.max, Math.max(lengths.min, Math.round(lengths.median * Math.exp(lengths.sigma * z))));
}

/**
 * The first token whose decoded prefix `ids[0..index]` contains a stop
 * string, and that string (the first of `stops`, in request order, found
 * there, as vLLM's `check_stop_strings` iterates); undefined when the text
 * never contains one. Special tokens are kept in the text, as with the
 * `skip_special_tokens: false` edgeloop sends.
 *
 * Found by a galloping then binary search over prefixes (a prefix's text
 * only grows as tokens are added, so "holds a stop string" flips once):
 * about 2·log2(index) decodes of at most `index + 1` tokens, where decoding
 * every prefix in turn was quadratic in the reply's length.
 * @see vLLM `StopChecker.check_stop_strings` and v1 `IncrementalDetokenizer.update` (text truncated, token ids kept)
 */
export function stopStringAt(tokenizer: ChatTokenizer, ids: readonly number[], stops: readonly string[]): { index: number; stop: string } | undefined {
  const found = (text: string) => stops.find((s) => s.length > 0 && text.includes(s));
  const n = ids.length;
  if (n === 0 || !found(tokenizer.decode(ids))) return undefined;
  const at = (k: number) => found(tokenizer.decode(ids.slice(0, k + 1)));
  // Invariant: no stop in prefix `lo` (−1: the empty prefix), one in prefix `hi` (n − 1: checked above).
  let lo = -1;
  let hi = n - 1;
  for (let step = 1, k = 0; k < hi; k = lo + step, step *= 2) {
    if (at(k) !== undefined) {
      hi = k;
      break;
    }
    lo = k;
  }
  while (hi - lo > 1) {
    const mid = lo + ((hi - lo) >> 1);
    if (at(mid) !== undefined) hi = mid;
    else lo = mid;
  }
  return { index: hi, stop: at(hi)! };
}

/** Deterministic log-probs in [−5, 0] for `n` tokens after `prompt`, from the script seed (4 decimals). */
export function simLogProbs(seed: number, prompt: readonly number[], n: number): number[] {
  let h = hashInt(0x3c6ef372, seed);
  for (let i = 0; i < prompt.length; i++) h = hashInt(h, prompt[i]);
  const out: number[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const u = unitFloat(hashInt(h, prompt.length + i));
    out[i] = Math.round(-5 * u * u * 1e4) / 1e4 + 0;
  }
  return out;
}

/**
 * Deterministic routed experts of the first `tokens` positions of
 * `stream` (a call's input ‖ output), int32 row-major `[tokens, layers,
 * top_k]`: a pure function of (script seed, position, token id, previous
 * token id, layer) — the same stream prefix always routes the same, as a
 * prefix-cached engine reports it. Slot k of a layer is `(h + k) mod
 * num_experts` for that layer's hash h, so a token's experts in one layer
 * are distinct. SGLang's coverage is `tokens = P + C − 1` (see `sglangReply`).
 */
export function simRoutedExperts(moe: SimMoe, seed: number, stream: readonly number[], tokens: number): Int32Array {
  const { layers, top_k: k, num_experts: e } = moe;
  const n = Math.max(0, Math.min(tokens, stream.length));
  const out = new Int32Array(n * layers * k);
  const s = hashInt(0x9e3779b9, seed);
  let o = 0;
  for (let p = 0; p < n; p++) {
    const h0 = hashInt(hashInt(hashInt(s, p), stream[p]!), p > 0 ? stream[p - 1]! : 0xffffffff);
    for (let l = 0; l < layers; l++) {
      const base = hashInt(h0, l) % e;
      for (let j = 0; j < k; j++) out[o++] = (base + j) % e;
    }
  }
  return out;
}
