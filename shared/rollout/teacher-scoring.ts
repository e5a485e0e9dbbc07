import { ConfigError, EngineAbortedError, EngineUnavailableError, TeacherError } from "../errors.ts";
import { createTeacherClient, type TeacherClient, type TeacherClientOptions } from "../inference/teacher-client.ts";
import type { AgentLoopOutput, TeacherConfig } from "../schema/index.ts";
import { SpanAttr, withSpan } from "../telemetry/tracer.ts";

/** Builds (or returns the cached) client of a `rollout.teacher` config; what a process's executors share. */
export type TeacherClientFactory = (cfg: TeacherConfig) => TeacherClient;

/** What {@link scoreWithTeacher} needs besides the outputs. */
export interface TeacherScoring {
  /** `rollout.teacher` of the trajectory's batch; null = no teacher (outputs returned as they are). */
  teacher: TeacherConfig | null;
  /** The process's teacher clients; absent where no teacher can run (then a configured teacher is a {@link TeacherError}). */
  clients?: TeacherClientFactory;
  /** The trajectory (session) key: routing key of every scoring call and the span's key. */
  key: string;
  signal?: AbortSignal;
  /** Fresh request ids (default `crypto.randomUUID()`). */
  newRequestId?: () => string;
}

/**
 * `out` with `teacher_log_probs` from the teacher's scores (one per response
 * token): each sampled token's score rounded to float32 (`Math.fround`, as
 * the queue stores it), 0.0 under mask 0 (observations, template tokens),
 * like `rollout_log_probs`.
 */
export function withTeacherLogProbs(out: AgentLoopOutput, scores: readonly number[]): AgentLoopOutput {
  const n = out.response_ids.length;
  const lps = new Array<number>(n);
  for (let i = 0; i < n; i++) lps[i] = out.response_mask[i] === 1 ? Math.fround(scores[i]!) : 0;
  return { ...out, teacher_log_probs: lps };
}

/**
 * Scores a finished trajectory's outputs with the teacher (`rollout.teacher`):
 * one prefill-only call per output on `prompt_ids ‖ response_ids`, each in an
 * `inference.score` span, routed by the trajectory key and retried like policy
 * calls. The one place every path (inline loops, durable sessions, queue
 * workers, Durable Objects, `openai_agent`) calls after its loop returned and
 * before the outputs are checkpointed as finished or stored; failed
 * trajectories never get here. An output that already has
 * `teacher_log_probs` (read back from a checkpoint) is not scored again.
 *
 * A teacher that still fails after retries: with `on_error: fail` (default)
 * this throws a {@link TeacherError} (the trajectory fails with it); with
 * `keep` the output is returned without `teacher_log_probs` and with
 * `extra_fields.teacher_error` (the error text).
 * @throws TeacherError (`on_error: fail`); the call's own error when `signal` aborted it
 */
export async function scoreWithTeacher(outputs: AgentLoopOutput[], s: TeacherScoring): Promise<AgentLoopOutput[]> {
  const cfg = s.teacher;
  if (!cfg || outputs.length === 0) return outputs;
  const out: AgentLoopOutput[] = [];
  for (const [i, o] of outputs.entries()) {
    if (o.teacher_log_probs) {
      out.push(o);
      continue;
    }
    try {
      if (!s.clients) throw new TeacherError("rollout.teacher is set but this deployment builds no teacher client");
      const client = s.clients(cfg);
      const scores = await withSpan("inference.score", { [SpanAttr.key]: s.key, "edgeloop.output_index": i, [SpanAttr.promptTokens]: o.prompt_ids.length, [SpanAttr.responseTokens]: o.response_ids.length, "edgeloop.teacher": client.describe }, () =>
        client.score({
          request_id: s.newRequestId?.() ?? crypto.randomUUID(),
          routing_key: s.key,
          prompt_ids: o.prompt_ids,
          response_ids: o.response_ids,
          ...(s.signal ? { signal: s.signal } : {}),
        }).catch((e: unknown) => {
          throw e instanceof TeacherError || s.signal?.aborted ? e : new TeacherError(`rollout.teacher (${client.describe}) could not score output ${i}: ${(e as Error)?.message ?? String(e)}`, { cause: e });
        }),
      );
      out.push(withTeacherLogProbs(o, scores));
    } catch (e) {
      if (s.signal?.aborted) throw e;
      if (cfg.on_error === "fail") throw e;
      const { teacher_log_probs: _none, ...rest } = o;
      out.push({ ...rest, extra_fields: { ...o.extra_fields, teacher_error: (e as Error).message } });
    }
  }
  return out;
}

/**
 * A {@link TeacherClientFactory} that builds one client per distinct
 * `rollout.teacher` (a batch may name its own) from `options(cfg)` — the
 * URL and fetch to use (an edge decides: plain fetch, an in-process gateway
 * over `urls`, an embedded simulator) — and keeps it for the process.
 */
export function cachedTeacherClients(options: (cfg: TeacherConfig) => TeacherClientOptions): TeacherClientFactory {
  const clients = new Map<string, TeacherClient>();
  return (cfg) => {
    const k = JSON.stringify([cfg.url ?? null, cfg.urls ?? null, cfg.format, cfg.model, cfg.timeout_ms]);
    let c = clients.get(k);
    if (!c) clients.set(k, (c = createTeacherClient(options(cfg))));
    return c;
  };
}

/** Printable text every start-up tokenizer check compares (plain words, digits, punctuation, non-ASCII, code, whitespace runs). */
export const TOKENIZER_PROBE = "edgeloop teacher check: The quick brown fox jumps over 13 lazy dogs — naïve café, 東京 🙂\n\tdef f(x):\n        return x ** 2  # ok";

/**
 * Refuses a teacher whose tokenizer differs from the policy's: the teacher
 * tokenizes {@link TOKENIZER_PROBE} (vLLM `POST /tokenize`, SGLang `POST
 * /v1/tokenize`, no special tokens added) and its ids must equal
 * `policyIds` (the policy tokenizer's ids of the same text). Teacher
 * log-probs are only meaningful on the policy's own token ids. A teacher
 * that does not answer (refused, 5xx, past `signal`) is not refused: the
 * reason is returned (the caller warns; its trajectories fail or keep per
 * `on_error` until it is up).
 * @throws ConfigError naming `rollout.teacher` when the ids differ or the teacher answers but cannot tokenize (no tokenize endpoint, garbled reply)
 */
export async function checkTeacherTokenizer(client: TeacherClient, policyIds: readonly number[], signal?: AbortSignal): Promise<string | null> {
  let ids: number[];
  try {
    ids = await client.tokenize(TOKENIZER_PROBE, signal);
  } catch (e) {
    if (e instanceof EngineUnavailableError || e instanceof EngineAbortedError) return (e as Error).message;
    throw new ConfigError("rollout.teacher", `cannot check the teacher's tokenizer (${client.describe}): ${(e as Error).message}`, { cause: e });
  }
  const at = firstDifference(ids, policyIds);
  if (at >= 0) {
    throw new ConfigError(
      "rollout.teacher",
      `the teacher (${client.describe}) uses another tokenizer than the policy: its ids of a probe text differ at position ${at} (${ids.length} ids: ${JSON.stringify(ids.slice(at, at + 4))}…, the policy's ${policyIds.length}: ${JSON.stringify(policyIds.slice(at, at + 4))}…); teacher log-probs need the policy's token ids — serve a teacher with the same tokenizer`,
    );
  }
  return null;
}

function firstDifference(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}
