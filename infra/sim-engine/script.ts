import { z } from "zod";
import { ConfigError, formatPath } from "../../shared/errors.ts";

/**
 * A fault the simulated engine injects instead of (or while) answering.
 *
 * - `http_500` / `http_503`: the engine answers that status with its error body.
 * - `hang`: holds the request for `ms` milliseconds, then answers normally;
 *   without `ms`, until the client gives up (disconnects / aborts).
 * - `abort_after`: generates `tokens` tokens (default 0), then finishes with
 *   `finish_reason: "abort"` (partial tokens are returned, as a preempted engine does).
 * - `context_overflow`: answers the engine's context-length 400.
 *
 * `times` limits the fault to the first n requests it applies to (default: all);
 * `turn` limits it to requests at that assistant-turn index (0-based).
 */
export const SimFault = z.strictObject({
  kind: z.enum(["http_500", "http_503", "hang", "abort_after", "context_overflow"]),
  tokens: z.number().int().min(0).optional(),
  ms: z.number().int().min(0).optional(),
  times: z.number().int().min(1).optional(),
  turn: z.number().int().min(0).optional(),
});
export type SimFault = z.infer<typeof SimFault>;

/**
 * Probabilistic faults (the chaos run's): each request draws a uniform u from
 * (seed, routing key, prompt ids, attempt), where attempt counts the requests
 * this engine has seen with the same routing key and prompt (a retry is the
 * next attempt, so it may succeed). u < `errors` → an HTTP error (`http_500`
 * or `http_503`, by a second draw); u < `errors + aborts` → `abort_after` k
 * tokens, k drawn in [0, `max_abort_tokens`]. The same requests in the same
 * order give the same faults on every run and replica.
 */
export const SimFaultRate = z
  .strictObject({
    errors: z.number().min(0).max(1).default(0),
    aborts: z.number().min(0).max(1).default(0),
    max_abort_tokens: z.number().int().min(0).default(8),
    /** Default: the script's seed. */
    seed: z.number().int().optional(),
  })
  .refine((f) => f.errors + f.aborts <= 1, { message: "errors + aborts must be at most 1", path: ["aborts"] });
export type SimFaultRate = z.infer<typeof SimFaultRate>;
export type SimFaultRateInput = z.input<typeof SimFaultRate>;

const Finish = z.enum(["stop", "length", "abort"]);

/**
 * One scripted assistant turn:
 * - a string: encoded with special tokens recognised, then `<|im_end|>`, `finish_reason: "stop"`;
 * - `{text, finish_reason?}`: as a string when `stop` (default); with `length` or
 *   `abort` the text is emitted without the end token and that finish reason;
 * - `{token_ids, finish_reason?}`: exactly these ids; the finish reason defaults
 *   to `stop` when the last id is one of the model's stop ids (Qwen3: 151645
 *   `<|im_end|>` or 151643 `<|endoftext|>`) or a requested stop id, else `length`.
 *   Generation always ends at the first such id, as a real engine's does.
 */
export const SimTurn = z.union([
  z.string(),
  z.strictObject({ text: z.string(), finish_reason: Finish.optional() }),
  z.strictObject({ token_ids: z.array(z.number().int().min(0)), finish_reason: Finish.optional() }),
]);
export type SimTurn = z.infer<typeof SimTurn>;

/**
 * A rule: applies when `when` occurs in the decoded prompt; its turns are
 * indexed by assistant turn. `variants` are other turn lists for the same
 * prompt, so that the `n` samples of a prompt differ (a group with mixed
 * rewards, what dynamic sampling keeps): each trajectory plays `turns` or one
 * variant, drawn uniformly from the `1 + variants.length` lists by (script
 * seed, rule index, the trajectory's session index — the `{session_id}` of
 * its routing key `{uid}_{session_id}_{output}`). A request without such a
 * routing key plays `turns`. Independent of the uid, so a run repeats.
 */
export const SimRule = z.strictObject({
  when: z.string().min(1, "must be a non-empty substring of the decoded prompt"),
  turns: z.array(SimTurn),
  variants: z.array(z.array(SimTurn)).optional(),
  fault: SimFault.optional(),
});
export type SimRule = z.infer<typeof SimRule>;

/**
 * Long-tailed response lengths for unscripted turns (the over-sampling
 * bench's stragglers): each turn played from `default` is stretched or cut
 * to L tokens, L drawn from a lognormal with the given `median` (tokens) and
 * `sigma` (of ln L), clamped to `min..max`, deterministic in (script seed,
 * the request's routing key, assistant-turn index) — so the n sessions of a
 * prompt differ, a retried or resumed turn draws the same L, and a run
 * repeats. The turn's text ids are repeated to L − 1 tokens and the model's
 * end token closes it (a turn whose text is a tool call keeps its call only
 * when L covers it; use `lengths` with plain-text `default` turns).
 */
export const SimLengths = z.strictObject({
  median: z.number().int().min(1),
  sigma: z.number().min(0).max(4),
  min: z.number().int().min(1).default(1),
  max: z.number().int().min(1).default(16_384),
}).refine((l) => l.min <= l.max && l.min <= l.median && l.median <= l.max, { message: "needs min <= median <= max", path: ["median"] });
export type SimLengths = z.infer<typeof SimLengths>;

/**
 * A scripted policy (the `--script FILE` JSON). The first rule whose `when`
 * occurs in the decoded prompt applies; turn index = number of assistant turns
 * already in the prompt; past the rule's last turn, and when no rule matches,
 * `default` applies (indexed from the first unscripted turn, the last entry repeating).
 * `seed` makes log-probs differ between scripts; `fault` applies to every request;
 * `fault_rate` injects random (seeded) faults into a share of the requests.
 * `lengths` draws the length of every unscripted turn from a lognormal
 * ({@link SimLengths}).
 */
export const SimScript = z.strictObject({
  seed: z.number().int().default(0),
  lengths: SimLengths.optional(),
  rules: z.array(SimRule).default([]),
  default: z.array(SimTurn).min(1, "needs at least one turn").default(["I cannot help with that."]),
  fault: SimFault.optional(),
  fault_rate: SimFaultRate.optional(),
});
export type SimScript = z.infer<typeof SimScript>;
/** The script as written in a file (defaults not yet applied). */
export type SimScriptInput = z.input<typeof SimScript>;

/** The built-in policy when no script is given: answers every turn "I cannot help with that.". */
export const DEFAULT_POLICY: SimScript = Object.freeze({
  seed: 1,
  rules: [],
  default: ["I cannot help with that."],
}) as SimScript;

/**
 * Validates a script (a parsed JSON value or JSON text).
 * @throws ConfigError naming the failing path, e.g. `config script.rules[0].turns[1]: ...`
 */
export function parseSimScript(input: unknown, source = "script"): SimScript {
  let value = input;
  if (typeof input === "string") {
    try {
      value = JSON.parse(input);
    } catch (e) {
      throw new ConfigError(source, `is not valid JSON: ${(e as Error).message}`, { cause: e });
    }
  }
  const r = SimScript.safeParse(value);
  if (!r.success) {
    const first = r.error.issues[0];
    throw new ConfigError(formatPath(source, first?.path ?? []), first?.message ?? "invalid script", { cause: r.error });
  }
  return r.data;
}
