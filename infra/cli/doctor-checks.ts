import { ConfigError } from "../../shared/errors.ts";
import { engineErrorMessage, joinUrl, VLLM_GENERATE_PATH } from "../../shared/inference/engine-http.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { ModelsReply } from "../../shared/inference/vllm-wire.ts";
import { checkTeacherTokenizer, TOKENIZER_PROBE } from "../../shared/rollout/teacher-scoring.ts";
import { GATEWAY_HEADER } from "../../functions/gateway.ts";
import type { TokenOutput } from "../../shared/schema/index.ts";
import { checkPauseResume } from "./doctor-pause.ts";
import { DOCTOR_MAX_TOKENS, DoctorProbe, ROUTING_KEY, type DoctorLine, type DoctorOptions, type HttpReply } from "./doctor-probe.ts";
import { decodesTo, firstDifference, idsAbsent, idsFix, idsSource, logprobsAbsent, logprobsFix, replyText } from "./doctor-replies.ts";

// The checks of `edgeloop doctor`: runDoctor and the data checks (reachable, models, generate, token ids,
// log-probs, tokenizer, stop ids, cached tokens, routed experts, teacher). What they share is in
// doctor-probe.ts, the pause/resume check in doctor-pause.ts, the reading of replies in doctor-replies.ts.
export { DOCTOR_CHECKS, DOCTOR_MAX_TOKENS, DOCTOR_PROMPT, type DoctorCheck, type DoctorLine, type DoctorOptions, type DoctorStatus } from "./doctor-probe.ts";
export { decodesTo, prometheusSum } from "./doctor-replies.ts";

/** `{check}{status}: {detail}` with the check name padded to one column. */
export function formatDoctorLine(l: DoctorLine): string {
  return `${l.check.padEnd(15)}${l.status}${l.detail ? `: ${l.detail}` : ""}`;
}

/** Whether any line fails (`missing` or `mismatch`): doctor then exits 1. */
export function doctorFailed(lines: readonly DoctorLine[]): boolean {
  return lines.some((l) => l.status === "missing" || l.status === "mismatch");
}

/**
 * Probes the engine of `config` the way edgeloop calls it, generating at most
 * a few tokens per call, and returns one line per {@link DOCTOR_CHECKS}
 * entry: reachability (`GET /health`), the API key, `GET /v1/models`
 * (`max_model_len`), one token-in/token-out call through edgeloop's own
 * client (ids, one finite log-prob per id, the family's stop ids), the
 * engine's tokenizer against the loaded one (`/tokenize` of a probe text,
 * and the reply's ids decoded against its text), cached-token reporting (a
 * second identical call), and when asked: pause/resume (`admin`), routed
 * experts (`rollout.return_routed_experts`) and the teacher's prompt
 * log-probs (`rollout.teacher`). Never throws for what the engine answers;
 * the lines say it.
 * @see docs/engines.md §6.2
 */
export async function runDoctor(o: DoctorOptions): Promise<DoctorLine[]> {
  return new Doctor(o).run();
}

class Doctor extends DoctorProbe {

  async run(): Promise<DoctorLine[]> {
    if (!(await this.reachable())) {
      this.skipRest(`${this.url} is not reachable (see reachable)`);
      return this.result();
    }
    await this.models();
    const control = this.control();
    const before = this.vllm ? await control.engine.status().then((s) => s.replicas) : null;
    const paused = before?.filter((r) => r.paused === true).map((r) => r.url) ?? [];
    if (paused.length > 0) {
      this.set(
        "pause/resume",
        "mismatch",
        `the engine is paused (GET /is_paused true at ${paused.join(", ")}): it holds every request until POST /resume; resume it (or let the trainer finish its weight update) and run doctor again`,
      );
      for (const c of ["generate", "token ids", "log-probs", "stop ids", "cached tokens", "routed experts"] as const) this.set(c, "skipped", "the engine is paused (see pause/resume)");
    }
    const probe = await this.tokenizeProbe();
    const first = paused.length > 0 ? null : await this.generateChecks();
    this.tokenizerLine(probe, first);
    if (first) {
      await this.cachedTokens(first);
      await this.routedExperts();
    }
    await this.teacher(first?.out);
    if (this.refused.length > 0) {
      const what = this.refused.join(", ");
      if (this.apiKey) this.set("auth", "mismatch", `the server refused engine.api_key (${what}): set it to the server's --api-key`);
      else this.set("auth", "missing", `the server wants an API key (${what}): set EDGELOOP_ENGINE_API_KEY (or --engine-api-key, engine.api_key) to its --api-key`);
    } else this.set("auth", "ok", this.apiKey ? "API key accepted" : "no API key needed");
    if (this.o.admin && paused.length === 0) {
      if (this.refused.length > 0) this.set("pause/resume", "skipped", "the server refused the data calls (see auth)");
      // SGLang cannot say whether it is paused: a generate call that was not served may be a trainer's pause,
      // and doctor's own resume would end it. Pause and resume only an engine that served a call.
      else if (!this.vllm && !first) this.set("pause/resume", "skipped", "the generate call was not served (see generate): SGLang cannot say whether it is paused, so doctor does not pause or resume it (a resume would end a trainer's pause)");
      else await checkPauseResume(this, control, before, first !== null);
    }
    this.set("pause/resume", "skipped", "add --admin to pause and resume the engine once (only while no request is running)");
    this.set("routed experts", "skipped", "rollout.return_routed_experts is off");
    this.set("teacher", "skipped", "rollout.teacher is not set");
    return this.result();
  }

  private async reachable(): Promise<boolean> {
    const h = await this.call(joinUrl(this.url, "/health"), "GET");
    if ("error" in h) {
      this.set("reachable", "missing", `nothing answers at ${this.url} (GET /health: ${h.error}): start the server, or fix --engine`);
      return false;
    }
    this.viaGateway = h.headers?.has(GATEWAY_HEADER) === true;
    if (h.status === 503) this.set("reachable", "mismatch", "GET /health answers 503: the engine is starting up, shutting down or dead; wait for 200, or restart it");
    else if (h.status >= 200 && h.status < 300) this.set("reachable", "ok", `GET /health ${h.status}`);
    else this.set("reachable", "ok", `answers (GET /health ${h.status})`);
    return true;
  }

  private async models(): Promise<void> {
    const cfgLen = this.o.config.rollout.max_model_len;
    const r = await this.call(joinUrl(this.url, "/v1/models"), "GET");
    let why: string;
    if ("error" in r) why = r.error;
    else if (this.wasRefused("GET /v1/models", r.status)) {
      // Not only an auth failure: without the list, edgeloop cannot read the server's context size either.
      const r0 = this.o.config.rollout;
      const budget = cfgLen !== null ? `rollout.max_model_len ${cfgLen} is used` : `the budget falls back to prompt_length + response_length = ${r0.prompt_length + r0.response_length}`;
      return this.set("models", "warn", `GET /v1/models is HTTP ${r.status} (see auth): the server's max_model_len cannot be read; ${budget}`);
    }
    else if (r.status < 200 || r.status >= 300) why = `HTTP ${r.status}`;
    else {
      const parsed = ModelsReply.safeParse(r.body);
      const cards = parsed.success ? parsed.data.data : [];
      const model = this.o.config.engine.model;
      if (model && this.vllm && cards.length > 0 && !cards.some((c) => c.id === model)) {
        return this.set("models", "mismatch", `engine.model '${model}' is not served here (served: ${cards.map((c) => c.id).join(", ")}): set engine.model to one of them, or leave it unset`);
      }
      const len = cards[0]?.max_model_len ?? undefined;
      if (len !== undefined) {
        if (cfgLen !== null && cfgLen > len) {
          return this.set("models", "mismatch", `rollout.max_model_len ${cfgLen} exceeds the server's max_model_len ${len}: long trajectories would overflow; lower it, or leave it unset to use the server's`);
        }
        return this.set("models", "ok", `${cards[0]!.id}, max_model_len ${len}${cfgLen !== null ? ` (rollout.max_model_len ${cfgLen} is used)` : ""}`);
      }
      why = cards.length === 0 ? "no model listed" : `no max_model_len for ${cards[0]!.id}`;
    }
    if (cfgLen !== null) return this.set("models", "ok", `GET /v1/models gives no max_model_len (${why}); rollout.max_model_len ${cfgLen} is used`);
    const r0 = this.o.config.rollout;
    this.set(
      "models",
      "warn",
      `GET /v1/models gives no max_model_len (${why}): the budget falls back to prompt_length + response_length = ${r0.prompt_length + r0.response_length}; set rollout.max_model_len (--max-model-len) to the server's context`,
    );
  }

  /** The engine's ids of {@link TOKENIZER_PROBE} (vLLM `POST /tokenize`, SGLang `POST /v1/tokenize`), or why there are none. */
  private async tokenizeProbe(): Promise<{ ids: number[] } | { unchecked: string } | { refused: true }> {
    const path = this.vllm ? "/tokenize" : "/v1/tokenize";
    const model = this.o.config.engine.model;
    const r = await this.call(joinUrl(this.url, path), "POST", { ...(model && this.vllm ? { model } : {}), prompt: TOKENIZER_PROBE, add_special_tokens: false });
    if ("error" in r) return { unchecked: `POST ${path}: ${r.error}` };
    if (this.wasRefused(`POST ${path}`, r.status)) return { refused: true };
    const tokens = (r.body as { tokens?: unknown } | undefined)?.tokens;
    if (r.status < 200 || r.status >= 300 || !Array.isArray(tokens) || !tokens.every((t) => Number.isSafeInteger(t))) {
      return { unchecked: `POST ${path} ${r.status < 200 || r.status >= 300 ? `is HTTP ${r.status}` : "answered no tokens list"}` };
    }
    return { ids: tokens as number[] };
  }

  /**
   * The first probe call: `generate`, `token ids`, `log-probs` and `stop ids`.
   * Returns the client and the reply (for the later checks), or null when there is no usable reply.
   */
  private async generateChecks(): Promise<{ client: InferenceClient; last: () => HttpReply | undefined; out: TokenOutput; body: unknown } | null> {
    const { client, last } = this.client();
    const dependent = ["token ids", "log-probs", "stop ids", "cached tokens", "routed experts"] as const;
    let out: TokenOutput | undefined;
    let error: unknown;
    try {
      out = await client.generate(this.request());
    } catch (e) {
      error = e;
    }
    const reply = last();
    if (!reply || reply.status < 200 || reply.status >= 300) {
      if (reply && this.wasRefused(`POST ${this.path}`, reply.status)) this.set("generate", "skipped", "the server refused the call (see auth)");
      else this.set("generate", reply?.status === 404 ? "missing" : "mismatch", this.generateFailure(reply, error));
      for (const c of dependent) this.set(c, "skipped", "no reply to check (see generate)");
      return null;
    }
    const full = out ?? this.parse(reply.body, true);
    const idsOnly = full instanceof Error ? this.parse(reply.body, false) : full;
    this.set("generate", "ok", idsOnly instanceof Error ? `POST ${this.path} answered HTTP ${reply.status}` : `POST ${this.path} answered ${idsOnly.token_ids.length} tokens (finish ${idsOnly.finish_reason})`);
    if (idsOnly instanceof Error) {
      this.set("token ids", idsAbsent(this.format, reply.body) ? "missing" : "mismatch", idsAbsent(this.format, reply.body) ? idsFix(this.format) : this.reason(idsOnly));
      for (const c of dependent) this.set(c, "skipped", "no token ids to check (see token ids)");
      return null;
    }
    this.set("token ids", "ok", idsSource(this.format, reply.body));
    if (full instanceof Error) {
      this.set("log-probs", logprobsAbsent(this.format, reply.body) ? "missing" : "mismatch", logprobsAbsent(this.format, reply.body) ? logprobsFix(this.format) : this.reason(full));
    } else {
      const n = full.log_probs?.length ?? 0;
      this.set("log-probs", "ok", `${n}, one per id, finite${this.vllm ? " (vLLM: serve with --logprobs-mode processed_logprobs, which doctor cannot see)" : ""}`);
    }
    this.stopIds(idsOnly);
    return { client, last, out: idsOnly, body: reply.body };
  }

  private generateFailure(reply: HttpReply | undefined, error: unknown): string {
    // SGLang has no is_paused to read first: a paused one holds the call until the deadline.
    if (!reply) return `POST ${this.path}: ${this.reason(error)}${this.vllm ? "" : " (a paused SGLang holds every request: POST /continue_generation resumes it)"}`;
    const message = engineErrorMessage(reply.body, reply.text);
    if (reply.status === 404) {
      const err = (reply.body as { error?: { type?: unknown } } | undefined)?.error;
      if (err && typeof err === "object" && err.type === "NotFoundError") return `POST ${this.path} is HTTP 404 (${message}): engine.model must name a served model (see models)`;
      if (this.format === "vllm-generate") {
        return `POST ${VLLM_GENERATE_PATH} is HTTP 404: start vLLM with --enable-scale-out (main) or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (0.2x), or use --engine-format vllm`;
      }
      return `POST ${this.path} is HTTP 404 (${message}): the server does not serve it; check --engine-format (vllm, vllm-generate, sglang)`;
    }
    return `POST ${this.path} is HTTP ${reply.status}: ${message}`;
  }

  private stopIds(out: TokenOutput): void {
    const stops = this.o.tokenizer.stopTokenIds;
    const sent = `sent ${this.name}'s stop ids [${stops.join(", ")}]`;
    const lastId = out.token_ids[out.token_ids.length - 1];
    if (out.finish_reason === "length") return this.set("stop ids", "ok", `${sent}: accepted (the reply reached max_tokens ${DOCTOR_MAX_TOKENS} first)`);
    if (out.finish_reason === "abort") return this.set("stop ids", "mismatch", `${sent}: the engine aborted the call after ${out.token_ids.length} tokens (is it being paused, or aborting requests?)`);
    if (typeof out.stop_reason === "string") return this.set("stop ids", "ok", `${sent}: accepted (the reply stopped at the string ${JSON.stringify(out.stop_reason)})`);
    if (lastId !== undefined && stops.includes(lastId)) return this.set("stop ids", "ok", `${sent}: the reply ended with ${lastId} (finish stop)`);
    this.set(
      "stop ids",
      "mismatch",
      `${sent}: the engine finished (stop) at ${lastId === undefined ? "no token" : `id ${lastId}`}, which is not a stop id of ${this.name}: the served model's end-of-turn ids differ from --model's (another model, or its generation_config.json eos_token_id)`,
    );
  }

  private tokenizerLine(probe: Awaited<ReturnType<Doctor["tokenizeProbe"]>>, first: { out: TokenOutput; body: unknown } | null): void {
    if ("refused" in probe && !first) return this.set("tokenizer", "skipped", "the server refused the call (see auth)");
    const tok = this.o.tokenizer;
    if ("ids" in probe) {
      const mine = tok.encode(TOKENIZER_PROBE);
      const at = firstDifference(probe.ids, mine);
      if (at >= 0) {
        return this.set(
          "tokenizer",
          "mismatch",
          `the engine's tokenizer differs from --model ${this.name}'s: its ids of a probe text differ at position ${at} (engine ${JSON.stringify(probe.ids.slice(at, at + 3))}…, ${this.name} ${JSON.stringify(mine.slice(at, at + 3))}…); start edgeloop with the served model's --model (a built-in name or the model's directory)`,
        );
      }
    }
    const text = first ? replyText(this.format, first.body) : undefined;
    let decoded: string | undefined;
    if (first && text !== undefined && !decodesTo(tok, first.out.token_ids, text)) {
      try {
        decoded = tok.decode(first.out.token_ids);
      } catch (e) {
        decoded = `(cannot decode: ${(e as Error).message})`;
      }
      return this.set(
        "tokenizer",
        "mismatch",
        `the reply's ids decode with --model ${this.name} to ${JSON.stringify(decoded.slice(0, 60))}, the engine's text is ${JSON.stringify(text.slice(0, 60))}: start edgeloop with the served model's --model`,
      );
    }
    const textNote = first && text !== undefined ? "the reply's ids decode to its text" : null;
    if ("ids" in probe) return this.set("tokenizer", "ok", `a probe text tokenizes to ${this.name}'s ids (POST ${this.vllm ? "/tokenize" : "/v1/tokenize"})${textNote ? `; ${textNote}` : ""}`);
    const why = "unchecked" in probe ? probe.unchecked : "tokenize refused (see auth)";
    if (textNote) return this.set("tokenizer", "ok", `${textNote} with ${this.name} (${why}: the probe text was not compared)`);
    this.set("tokenizer", "warn", `cannot compare tokenizers (${why}, and the reply has no text): make sure --model ${this.name} is the served model's`);
  }

  /** A second identical call: `cached_tokens` (read from the ids-only parse when the adapter refuses the reply for its log-probs, which has its own line). */
  private async cachedTokens(probe: { client: InferenceClient; last: () => HttpReply | undefined }): Promise<void> {
    let out: TokenOutput;
    try {
      out = await probe.client.generate(this.request());
    } catch (e) {
      const reply = probe.last();
      const idsOnly = reply && reply.status >= 200 && reply.status < 300 ? this.parse(reply.body, false) : null;
      if (!idsOnly || idsOnly instanceof Error) return this.set("cached tokens", "mismatch", `a second identical call failed: ${this.reason(e)}`);
      out = idsOnly;
    }
    if (out.cached_tokens === undefined) {
      return this.set(
        "cached tokens",
        "missing",
        this.vllm
          ? "the replies carry no usage.prompt_tokens_details.cached_tokens: start vLLM with --enable-prompt-tokens-details (without it prefix-cache hits go unreported)"
          : "the replies carry no meta_info.cached_tokens (SGLang always sends it: a proxy in front strips it?)",
      );
    }
    const of = `${out.cached_tokens} of ${this.prompt.length} prompt tokens cached on a repeated call`;
    this.set("cached tokens", "ok", out.cached_tokens > 0 ? of : `${of} (prefix caching off?)`);
  }

  private async routedExperts(): Promise<void> {
    if (!this.o.config.rollout.return_routed_experts) return;
    const { client: c, last } = this.client();
    try {
      const out = await c.generate(this.request({ experts: true }));
      const x = out.routed_experts;
      if (!x) return this.set("routed experts", "missing", "the reply has no routed experts: start SGLang with --enable-return-routed-experts");
      this.set("routed experts", "ok", `meta_info.routed_experts decodes as ${x.tokens} tokens × ${x.shape[0]} layers × top-${x.shape[1]} (engine.moe)`);
    } catch (e) {
      const body = last()?.body as { meta_info?: { routed_experts?: unknown } } | undefined;
      if (e instanceof ConfigError) return this.set("routed experts", "mismatch", e.message);
      if (body && body.meta_info && body.meta_info.routed_experts == null) return this.set("routed experts", "missing", "the reply has no meta_info.routed_experts: start SGLang with --enable-return-routed-experts");
      this.set("routed experts", "mismatch", this.reason(e));
    }
  }

  private async teacher(out: TokenOutput | undefined): Promise<void> {
    const t = this.o.teacher;
    if (!t || !this.o.config.rollout.teacher) return;
    const tok = this.o.tokenizer;
    let unreachable: string | null;
    try {
      unreachable = await checkTeacherTokenizer(t, tok.encode(TOKENIZER_PROBE), AbortSignal.timeout(this.o.timeoutMs));
    } catch (e) {
      return this.set("teacher", "mismatch", (e as Error).message.replace(/^config rollout\.teacher: /, ""));
    }
    if (unreachable !== null) return this.set("teacher", "missing", `the teacher (${t.describe}) does not answer: ${unreachable}`);
    const response = out && out.token_ids.length > 0 ? out.token_ids : [...tok.encode("OK."), tok.eosTokenId];
    try {
      const scores = await t.score({ request_id: `edgeloop-doctor-${crypto.randomUUID()}`, routing_key: ROUTING_KEY, prompt_ids: this.prompt, response_ids: response, signal: AbortSignal.timeout(this.o.timeoutMs) });
      if (scores.length !== response.length || scores.some((s) => !Number.isFinite(s))) {
        return this.set("teacher", "mismatch", `the teacher (${t.describe}) returned ${scores.length} prompt log-probs for ${response.length} response tokens${scores.some((s) => !Number.isFinite(s)) ? " (not all finite)" : ""}`);
      }
      this.set("teacher", "ok", `${t.describe}: same tokenizer; scored ${response.length} response tokens (prompt log-probs)`);
    } catch (e) {
      this.set("teacher", "mismatch", `the teacher (${t.describe}) could not score a probe: ${(e as Error).message}`);
    }
  }

}




