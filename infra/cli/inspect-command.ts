import { createReadStream } from "node:fs";
import { access } from "node:fs/promises";
import { createInterface } from "node:readline";
import { ConfigError, InputError, NotFoundError } from "../../shared/errors.ts";
import { parseTrajectoryKey, TrajectoryRecord } from "../../shared/schema/index.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { tokenPieces } from "../../shared/telemetry/token-pieces.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { decodeRefusal, isBuiltinModel, modelIdOf } from "../../shared/models/index.ts";
import { createRedisTransferQueue } from "../redis/redis-transfer-queue.ts";
import { terminalSafe, terminalSafeJson } from "./terminal-text.ts";

/** Flags of `edgeloop inspect`. */
export interface InspectFlags {
  store?: string;
  storePrefix?: string;
  file?: string;
  json?: boolean;
  model?: string;
  /** true/false from `--color`/`--no-color`; undefined = colour when stdout is a terminal and `NO_COLOR` is unset. */
  color?: boolean;
  prompt?: boolean;
}

/** ANSI styles of the rendering. */
const STYLE = { prompt: "\x1b[2m", sampled: "\x1b[32m", observation: "\x1b[36m", head: "\x1b[1;90m", trunc: "\x1b[1;31m", reset: "\x1b[0m" } as const;

/** Options of {@link renderTrajectory}. */
export interface RenderOptions {
  /** ANSI colours: sampled tokens (mask 1) green, observation tokens (mask 0) cyan, the prompt dim. */
  color: boolean;
  /** Print the prompt too (default true). */
  prompt?: boolean;
}

/**
 * A trajectory as text: the prompt, then each run of the response under a
 * `── assistant turn n ──` / `── observation n ──` header (so the mask reads
 * without colours too), the truncation point, and a one-line summary:
 * `key agent reward turns finish truncated tokens prompt/sampled/observation [error]`.
 * `pieces` are the per-token strings ({@link tokenPieces}). Text from the
 * record (prompt, turns, observations, errors) is {@link terminalSafe}:
 * control and bidi characters are shown escaped, never sent to the terminal.
 */
export function renderTrajectory(r: TrajectoryRecord, pieces: { prompt: string[]; response: string[] }, opts: RenderOptions): string {
  const paint = (style: keyof typeof STYLE, s: string) => (opts.color && s ? `${STYLE[style]}${s}${STYLE.reset}` : s);
  const out: string[] = [];
  const block = (head: string, style: keyof typeof STYLE, text: string) => {
    out.push(paint("head", `── ${head} ──`) + "\n");
    out.push(paint(style, terminalSafe(text)));
    if (!text.endsWith("\n")) out.push("\n");
  };
  if (opts.prompt !== false) block(`prompt (${r.prompt_ids.length} tokens)`, "prompt", pieces.prompt.join(""));
  let turns = 0;
  let obs = 0;
  for (let i = 0; i < r.response_mask.length; ) {
    const m = r.response_mask[i];
    let j = i;
    while (j < r.response_mask.length && r.response_mask[j] === m) j++;
    const text = pieces.response.slice(i, j).join("");
    if (m === 1) block(`assistant turn ${++turns} (${j - i} tokens, mask 1)`, "sampled", text);
    else block(`observation ${++obs} (${j - i} tokens, mask 0)`, "observation", text);
    i = j;
  }
  const terminated = typeof r.extra_fields.terminated_by === "string" ? r.extra_fields.terminated_by : null;
  if (r.truncated) out.push(paint("trunc", terminalSafe(`✂ truncated after ${r.response_ids.length} response tokens (${r.finish_reason}${terminated ? `, ${terminated}` : ""})`, { newlines: false })) + "\n");
  const experts = routedExpertsLine(r);
  if (experts) out.push(experts + "\n");
  out.push(summaryLine(r) + "\n");
  return out.join("");
}

/**
 * The routed experts of a record in one line, or null when it has none:
 * `routed experts: [layers, top_k] = [L, K] over T tokens (prompt ‖ response); last response token: l0 [a b] l1 [c d] …`
 * (the last token's rows are usually the fill value 0: it was sampled, never forwarded).
 */
export function routedExpertsLine(r: TrajectoryRecord): string | null {
  if (!r.routed_experts || !r.routed_experts_shape) return null;
  const [layers, topK] = r.routed_experts_shape;
  const per = layers * topK;
  const tokens = r.routed_experts.length / per;
  const rowsOf = (t: number) => Array.from({ length: layers }, (_, l) => `l${l} [${r.routed_experts!.slice(t * per + l * topK, t * per + (l + 1) * topK).join(" ")}]`).join(" ");
  const last = tokens > 1 ? `; last forwarded token (#${tokens - 2}): ${rowsOf(tokens - 2)}` : "";
  return `routed experts: [layers, top_k] = [${layers}, ${topK}] over ${tokens} tokens (prompt ‖ response)${last}`;
}

/** The one-line summary of a record ({@link terminalSafe}, newlines escaped too). */
export function summaryLine(r: TrajectoryRecord): string {
  const sampled = r.response_mask.reduce<number>((n, m) => n + m, 0);
  const terminated = typeof r.extra_fields.terminated_by === "string" ? `(${r.extra_fields.terminated_by})` : "";
  const parts = [
    r.key,
    `agent=${r.agent_name}`,
    `reward=${r.reward_score ?? "null"}`,
    `turns=${r.num_turns}`,
    `finish=${r.finish_reason}${terminated}`,
    `truncated=${r.truncated ? "yes" : "no"}`,
    `tokens prompt=${r.prompt_ids.length} sampled=${sampled} observation=${r.response_ids.length - sampled}`,
  ];
  if (r.error !== null) parts.push(`error=${JSON.stringify(r.error)}`);
  const teacher = teacherSummary(r);
  if (teacher) parts.push(teacher);
  return terminalSafe(parts.join("  "), { newlines: false });
}

/**
 * The teacher part of the summary (`rollout.teacher`): the mean teacher and
 * rollout log-prob over sampled tokens (4 decimals), or the teacher's error
 * when it was kept without them; null without a teacher.
 */
export function teacherSummary(r: TrajectoryRecord): string | null {
  if (!r.teacher_log_probs) return typeof r.extra_fields.teacher_error === "string" ? `teacher_error=${JSON.stringify(r.extra_fields.teacher_error)}` : null;
  let n = 0;
  let t = 0;
  let p = 0;
  for (let i = 0; i < r.response_mask.length; i++) {
    if (r.response_mask[i] !== 1) continue;
    n++;
    t += r.teacher_log_probs[i]!;
    p += r.rollout_log_probs?.[i] ?? 0;
  }
  const mean = (x: number) => (n === 0 ? "–" : (x / n).toFixed(4));
  return `teacher lp mean=${mean(t)}${r.rollout_log_probs ? ` (rollout ${mean(p)})` : ""}`;
}

/**
 * Finds the record of `key` in a JSONL file of TrajectoryRecords (what
 * `edgeloop rollout --out` writes); the last line with that key wins.
 * @throws InputError (`--file`) when the file cannot be read; NotFoundError when no line has the key.
 */
export async function recordFromFile(path: string, key: string): Promise<TrajectoryRecord> {
  await access(path).catch((e) => {
    throw new InputError("--file", `cannot read ${path}: ${(e as Error).message}`);
  });
  let found: TrajectoryRecord | null = null;
  const needle = `"key":${JSON.stringify(key)}`;
  const lines = createInterface({ input: createReadStream(path), crlfDelay: Infinity });
  let n = 0;
  for await (const line of lines) {
    n++;
    if (!line.includes(needle)) continue;
    const parsed = TrajectoryRecord.safeParse(JSON.parse(line));
    if (!parsed.success) throw new InputError("--file", `${path}:${n} is not a TrajectoryRecord: ${parsed.error.issues[0]?.message}`);
    if (parsed.data.key === key) found = parsed.data;
  }
  if (!found) throw new NotFoundError(`no trajectory '${key}' in ${path}`, { field: "key" });
  return found;
}

function openStore(url: string, prefix: string | undefined): TransferQueue {
  if (url === "memory") {
    throw new ConfigError("--store", "the memory store lives inside one process and holds nothing here: pass --file rollouts.jsonl, or --store redis://host:port / upstash");
  }
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("--store", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    return createUpstashTransferQueue({ url: restUrl, token, prefix });
  }
  if (!/^rediss?:\/\//.test(url)) throw new ConfigError("--store", `expected memory, upstash or a redis:// URL, got '${url}'`);
  return createRedisTransferQueue({ url, prefix });
}

/**
 * `edgeloop inspect KEY [--file rollouts.jsonl | --store redis://… [--store-prefix P]] [--json]`:
 * prints one trajectory decoded, coloured by mask, with a one-line summary;
 * `--json` prints the record itself (one line of JSON). Tokens are decoded
 * with `--model`, else the record's own `model` when it is built in, else
 * Qwen3; a record of another model (its fingerprint) is refused, not decoded.
 * @throws InputError for a malformed key, or (`--model`) a record of another model than the tokenizer's; NotFoundError when the record is absent; ConfigError for an unusable store.
 */
export async function inspectCommand(key: string, flags: InspectFlags): Promise<void> {
  parseTrajectoryKey(key);
  let record: TrajectoryRecord | null;
  // One source: a file and a store together would leave one of them silently unread.
  if (flags.file && (flags.store !== undefined || flags.storePrefix !== undefined)) {
    throw new InputError(flags.store !== undefined ? "--store" : "--store-prefix", "reads the store; --file reads a JSONL file: give one of them");
  }
  if (flags.file) record = await recordFromFile(flags.file, key);
  else {
    const store = openStore(flags.store ?? "memory", flags.storePrefix);
    try {
      record = await store.get(key);
    } finally {
      await store.close();
    }
    if (!record) throw new NotFoundError(`no trajectory '${key}' in ${flags.store}${flags.storePrefix ? ` (prefix ${flags.storePrefix})` : ""}`, { field: "key" });
  }
  if (flags.json) {
    process.stdout.write(terminalSafeJson(JSON.stringify(record)) + "\n");
    return;
  }
  // The record names its model: without --model, a built-in one is loaded; a tokenizer of another model never decodes it.
  const recorded = record.model;
  const tokenizer = await loadTokenizer(flags.model ?? (recorded && isBuiltinModel(recorded.name) ? recorded.name : undefined));
  const why = decodeRefusal(recorded, await modelIdOf(tokenizer));
  if (why) throw new InputError("--model", `trajectory ${key}: ${why}`);
  const color = flags.color ?? (Boolean(process.stdout.isTTY) && !process.env.NO_COLOR);
  const pieces = { prompt: tokenPieces(tokenizer, record.prompt_ids), response: tokenPieces(tokenizer, record.response_ids) };
  process.stdout.write(renderTrajectory(record, pieces, { color, prompt: flags.prompt }));
}
