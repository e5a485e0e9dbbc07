import type { AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { DEFAULT_ENGINE_MAX_REPLY_BYTES, readTextCapped, redactUrl } from "../../shared/http/outbound.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import { EngineControl, MemoryEngineGate, type EngineReplicaTarget, type ReplicaControlResult } from "../../shared/inference/engine-control.ts";
import { DEADLINE_HEADER, engineErrorMessage, joinUrl, VLLM_GENERATE_PATH, type FetchLike } from "../../shared/inference/engine-http.ts";
import { parseSglangReply } from "../../shared/inference/sglang-client.ts";
import type { TeacherClient } from "../../shared/inference/teacher-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { parseCompletionReply, parseGenerateReply } from "../../shared/inference/vllm-client.ts";
import { ModelsReply } from "../../shared/inference/vllm-wire.ts";
import { checkTeacherTokenizer, TOKENIZER_PROBE } from "../../shared/rollout/teacher-scoring.ts";
import { GATEWAY_HEADER } from "../../functions/gateway.ts";
import type { TokenOutput } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/** The checks of `edgeloop doctor`, in the order they are printed (one line each, always all of them). */
export const DOCTOR_CHECKS = ["reachable", "auth", "models", "generate", "token ids", "log-probs", "tokenizer", "stop ids", "cached tokens", "pause/resume", "routed experts", "teacher"] as const;
export type DoctorCheck = (typeof DOCTOR_CHECKS)[number];

/**
 * How a check came out: `ok`; `warn` (works, with a caveat the line names);
 * `skipped` (not asked for by the config or the flags, or not checkable, the
 * line says why); `missing` (the engine lacks something edgeloop needs: the
 * line names the server flag or setting); `mismatch` (the engine answers, but
 * not as edgeloop's config expects). Only `missing` and `mismatch` fail.
 */
export type DoctorStatus = "ok" | "warn" | "skipped" | "missing" | "mismatch";

/** One printed line: the check, its status and a short fact or the fix. */
export interface DoctorLine {
  check: DoctorCheck;
  status: DoctorStatus;
  detail: string;
}

/** What {@link runDoctor} probes and with what. */
export interface DoctorOptions {
  /** The resolved config; `engine.url` is an http(s) URL (not `sim`). */
  config: AppConfig;
  /** The tokenizer edgeloop loaded for `model` (`--model`): prompts are rendered and ids compared with it. */
  tokenizer: ChatTokenizer;
  /** Pause and resume the engine once (`--admin`): only when no request is running there. */
  admin: boolean;
  /** With `admin`: pause even when doctor cannot tell whether requests are running (`--force`). */
  force: boolean;
  /** Deadline of each probe call, ms. */
  timeoutMs: number;
  /** The teacher's client when `rollout.teacher` is set (`teacherClientsFor`). */
  teacher?: TeacherClient;
  /** Web-standard fetch (default the global one). */
  fetch?: FetchLike;
}

/** Generated tokens per probe call: enough for a short scripted answer to end with its stop id, few on a real engine. */
export const DOCTOR_MAX_TOKENS = 8;

/** The probe's user turn, rendered with the loaded tokenizer's chat template (long enough to fill two 16-token cache blocks). */
export const DOCTOR_PROMPT = "This is an edgeloop doctor probe: it checks that the engine answers with token ids and log-probs. Reply with one short sentence.";

/** Routing key of every probe call (doctor's own, so a sticky router keeps them on one replica). */
const ROUTING_KEY = "edgeloop-doctor";

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

interface HttpReply {
  status: number;
  text: string;
  body: unknown;
  headers?: Headers;
}
type Got = HttpReply | { error: string };

class Doctor {
  private readonly lines = new Map<DoctorCheck, DoctorLine>();
  private readonly refused: string[] = [];
  private readonly f: FetchLike;
  private readonly url: string;
  private readonly format: AppConfig["engine"]["format"];
  private readonly vllm: boolean;
  private readonly apiKey: string | null;
  private readonly controlKey: string | null;
  private readonly name: string;
  private readonly prompt: number[];
  private readonly path: string;
  /** Whether `engine.url` is edgeloop's own gateway (its `/health` carries `x-edgeloop-gateway`): it forwards no engine control. */
  private viaGateway = false;

  constructor(private readonly o: DoctorOptions) {
    const e = o.config.engine;
    this.f = o.fetch ?? ((input, init) => fetch(input, init));
    this.url = e.url;
    this.format = e.format;
    this.vllm = e.format !== "sglang";
    this.apiKey = e.api_key;
    this.controlKey = e.admin_api_key ?? e.api_key;
    this.name = o.tokenizer.name;
    this.prompt = o.tokenizer.renderIds([{ role: "user", content: DOCTOR_PROMPT }], { addGenerationPrompt: true });
    this.path = e.format === "sglang" ? "/generate" : e.format === "vllm-generate" ? VLLM_GENERATE_PATH : "/v1/completions";
  }

  private set(check: DoctorCheck, status: DoctorStatus, detail: string): void {
    if (!this.lines.has(check)) this.lines.set(check, { check, status, detail });
  }

  private skipRest(detail: string): void {
    for (const c of DOCTOR_CHECKS) this.set(c, "skipped", detail);
  }

  private result(): DoctorLine[] {
    return DOCTOR_CHECKS.map((c) => this.lines.get(c) ?? { check: c, status: "skipped", detail: "" });
  }

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
      else await this.pauseResume(control, before, first !== null);
    }
    this.set("pause/resume", "skipped", "add --admin to pause and resume the engine once (only while no request is running)");
    this.set("routed experts", "skipped", "rollout.return_routed_experts is off");
    this.set("teacher", "skipped", "rollout.teacher is not set");
    return this.result();
  }

  /** One HTTP call with the deadline; the error text instead of a throw when nothing answers. */
  private async call(url: string, method: "GET" | "POST", body?: unknown, key: string | null = this.apiKey): Promise<Got> {
    const headers: Record<string, string> = { accept: "application/json", [DEADLINE_HEADER]: String(this.o.timeoutMs) };
    if (key) headers.authorization = `Bearer ${key}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    try {
      // Bounded like every outbound call: no redirect followed, the reply read under the engines' cap.
      const res = await this.f(url, { method, headers, redirect: "manual", ...(body === undefined ? {} : { body: JSON.stringify(body) }), signal: AbortSignal.timeout(this.o.timeoutMs) });
      const text = await readTextCapped(res, DEFAULT_ENGINE_MAX_REPLY_BYTES, `doctor ${redactUrl(url)}`);
      let parsed: unknown;
      try {
        parsed = text.length > 0 ? JSON.parse(text) : undefined;
      } catch {
        parsed = undefined;
      }
      return { status: res.status, text, body: parsed, headers: res.headers };
    } catch (e) {
      return { error: (e as Error)?.name === "TimeoutError" ? `no answer within ${this.o.timeoutMs} ms` : ((e as Error)?.message ?? String(e)) };
    }
  }

  /** Whether a data call was refused for its key (401/403): noted for the auth line. */
  private wasRefused(what: string, status: number): boolean {
    if (status !== 401 && status !== 403) return false;
    this.refused.push(`${what} ${status}`);
    return true;
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

  /**
   * The pause control over `engine.admin_urls` (else `engine.url`); `failed`
   * holds each target's first non-2xx answer since it was last cleared (a
   * failed pause is rolled back by a resume, whose answer must not hide the pause's).
   */
  private control(): { engine: EngineControl; targets: EngineReplicaTarget[]; failed: Map<string, { path: string; status: number }> } {
    const failed = new Map<string, { path: string; status: number }>();
    const urls = this.o.config.engine.admin_urls ?? [this.url];
    const targets = urls.map((url) => ({
      url,
      ...(this.controlKey ? { apiKey: this.controlKey } : {}),
      fetch: (async (input, init) => {
        const res = await this.f(input, init);
        if ((res.status < 200 || res.status >= 300) && !failed.has(url)) failed.set(url, { path: new URL(String(input instanceof Request ? input.url : input)).pathname, status: res.status });
        return res;
      }) as FetchLike,
    }));
    const engine = new EngineControl({ gate: new MemoryEngineGate(), format: this.format, replicas: () => targets, timeoutMs: this.o.timeoutMs });
    return { engine, targets, failed };
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

  /** A client of edgeloop's own adapter whose every reply is recorded (status, text, parsed body). */
  private client(): { client: InferenceClient; last: () => HttpReply | undefined } {
    let last: HttpReply | undefined;
    const e = this.o.config.engine;
    const recording: FetchLike = async (input, init) => {
      last = undefined;
      const res = await this.f(input, init);
      const text = await res.text();
      let body: unknown;
      try {
        body = text.length > 0 ? JSON.parse(text) : undefined;
      } catch {
        body = undefined;
      }
      last = { status: res.status, text, body };
      return new Response(text, { status: res.status, headers: res.headers });
    };
    const moe = e.moe ? { layers: e.moe.layers, top_k: e.moe.top_k } : undefined;
    const client = createEngineClient({ url: this.url, format: this.format, ...(e.model ? { model: e.model } : {}), timeoutMs: this.o.timeoutMs, fetch: recording, apiKey: this.apiKey, ...(moe ? { moe } : {}) });
    return { client, last: () => last };
  }

  private request(opts: { maxTokens?: number; experts?: boolean } = {}): GenerateRequest {
    return {
      request_id: `edgeloop-doctor-${crypto.randomUUID()}`,
      routing_key: ROUTING_KEY,
      prompt_ids: this.prompt,
      sampling_params: { temperature: 0, top_p: 1, top_k: -1, stop_token_ids: [...this.o.tokenizer.stopTokenIds], logprobs: true },
      max_tokens: opts.maxTokens ?? DOCTOR_MAX_TOKENS,
      ...(opts.experts ? { return_routed_experts: true } : {}),
    };
  }

  /** The reply parsed as edgeloop's adapter parses it (`wantLogprobs` as given); the error when it refuses it. */
  private parse(body: unknown, wantLogprobs: boolean): TokenOutput | Error {
    const url = joinUrl(this.url, this.path);
    try {
      if (this.format === "sglang") return parseSglangReply(url, body, wantLogprobs);
      if (this.format === "vllm-generate") return parseGenerateReply(url, body, wantLogprobs);
      return parseCompletionReply(url, body, wantLogprobs);
    } catch (e) {
      return e as Error;
    }
  }

  /** Message of an adapter error without the `engine at URL sent an unusable reply:` lead (the URL is in the header). */
  private reason(e: unknown): string {
    const m = (e as Error)?.message ?? String(e);
    const lead = `engine at ${joinUrl(this.url, this.path)} sent an unusable reply: `;
    return m.startsWith(lead) ? m.slice(lead.length) : m;
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
      this.set("token ids", this.idsAbsent(reply.body) ? "missing" : "mismatch", this.idsAbsent(reply.body) ? this.idsFix() : this.reason(idsOnly));
      for (const c of dependent) this.set(c, "skipped", "no token ids to check (see token ids)");
      return null;
    }
    this.set("token ids", "ok", this.idsSource(reply.body));
    if (full instanceof Error) {
      this.set("log-probs", this.logprobsAbsent(reply.body) ? "missing" : "mismatch", this.logprobsAbsent(reply.body) ? this.logprobsFix() : this.reason(full));
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

  /** Whether the reply carries no ids in any of the forms the adapters read (as against ids that are there but refused). */
  private idsAbsent(body: unknown): boolean {
    const b = (body ?? {}) as Record<string, unknown>;
    if (this.format === "sglang") {
      const lps = (b.meta_info as Record<string, unknown> | undefined)?.output_token_logprobs;
      return b.output_ids == null && b.token_ids == null && !(Array.isArray(lps) && lps.length > 0);
    }
    const c = (Array.isArray(b.choices) ? b.choices[0] : undefined) as Record<string, unknown> | undefined;
    if (!c) return false;
    if (c.token_ids != null) return false;
    const lp = c.logprobs as Record<string, unknown> | null | undefined;
    if (this.format === "vllm-generate") {
      const content = lp?.content;
      return !(Array.isArray(content) && content.some((x) => x && (typeof (x as { token_id?: unknown }).token_id === "number" || /^token_id:\d+$/.test(String((x as { token?: unknown }).token)))));
    }
    const tokens = lp?.tokens;
    return !(Array.isArray(tokens) && tokens.some((t) => /^token_id:\d+$/.test(String(t))));
  }

  private idsFix(): string {
    if (this.format === "sglang") return "the reply has no output_ids (nor ids in meta_info.output_token_logprobs): edgeloop never re-encodes text; serve SGLang's native /generate unmodified (a proxy in front may strip them)";
    if (this.format === "vllm-generate") return "the reply has no choices[0].token_ids (nor ids in logprobs.content): edgeloop never re-encodes text; a proxy in front may strip them";
    return "the reply has neither choices[0].token_ids nor token_id:N strings in logprobs.tokens: edgeloop never re-encodes text; it needs vLLM >= 0.10.2 (return_token_ids) or a server that honours return_tokens_as_token_ids";
  }

  /** Where the ids came from, for the ok line. */
  private idsSource(body: unknown): string {
    const b = (body ?? {}) as Record<string, unknown>;
    if (this.format === "sglang") return b.output_ids != null ? "output_ids" : b.token_ids != null ? "token_ids" : "meta_info.output_token_logprobs";
    const c = ((b.choices as unknown[])?.[0] ?? {}) as Record<string, unknown>;
    if (c.token_ids != null) return "choices[0].token_ids";
    return this.format === "vllm-generate" ? "choices[0].logprobs.content" : "token_id:N strings in choices[0].logprobs.tokens (no token_ids: vLLM < 0.10.2)";
  }

  private logprobsAbsent(body: unknown): boolean {
    const b = (body ?? {}) as Record<string, unknown>;
    if (this.format === "sglang") return (b.meta_info as Record<string, unknown> | undefined)?.output_token_logprobs == null;
    const c = ((b.choices as unknown[])?.[0] ?? {}) as Record<string, unknown>;
    const lp = c.logprobs as Record<string, unknown> | null | undefined;
    if (lp == null) return true;
    return this.format === "vllm-generate" ? lp.content == null : lp.token_logprobs == null;
  }

  private logprobsFix(): string {
    if (this.format === "sglang") return "the reply has no meta_info.output_token_logprobs although return_logprob was sent: rollout_log_probs need one per sampled token; a proxy in front may strip meta_info";
    return `the reply has no ${this.format === "vllm-generate" ? "choices[0].logprobs.content" : "choices[0].logprobs.token_logprobs"} although logprobs: 0 was sent: rollout_log_probs need one per sampled token; a proxy in front may strip them`;
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

  /**
   * `--admin`: with no request running at any target (vLLM `vllm:num_requests_running`
   * and `_waiting` on `GET /metrics`; SGLang `GET /get_load`, else `sglang:num_running_reqs`
   * and `sglang:num_queue_reqs` on `/metrics`), one pause (`abort`, cache kept) and resume through
   * edgeloop's `EngineControl`, vLLM's `/is_paused` read after each, then one call served.
   */
  private async pauseResume(control: ReturnType<Doctor["control"]>, before: ReplicaControlResult[] | null, served: boolean): Promise<void> {
    const fail = (r: ReplicaControlResult | { url: string; status: number; error?: string }, path: string) => this.controlFailure(r.url, path, r.status, r.error);
    for (const r of before ?? []) if (!r.ok) return fail(r, "/is_paused");
    const busy: string[] = [];
    const unknown: string[] = [];
    for (const t of control.targets) {
      const n = await this.running(t.url);
      if (typeof n === "number") {
        if (n > 0) busy.push(`${n} at ${t.url}`);
      } else unknown.push(`${t.url}: ${n.unknown}`);
    }
    if (busy.length > 0) return this.set("pause/resume", "skipped", `requests are running or waiting (${busy.join(", ")}): a pause would abort them; run doctor --admin while the engine is idle`);
    if (unknown.length > 0 && !this.o.force) {
      return this.set("pause/resume", "skipped", `cannot tell whether requests are running (${unknown.join("; ")}): add --force to pause and resume anyway (requests running there would end as aborts)`);
    }
    const failed = (what: string) => {
      for (const t of control.targets) {
        const l = control.failed.get(t.url);
        if (l) return this.controlFailure(t.url, l.path, l.status);
      }
      return this.set("pause/resume", "mismatch", what);
    };
    control.failed.clear();
    try {
      await control.engine.pause({ mode: "abort", clear_cache: false });
    } catch (e) {
      return failed(`the pause failed: ${(e as Error).message}`);
    }
    const during = this.vllm ? (await control.engine.status()).replicas : [];
    let resumeError: string | null = null;
    control.failed.clear();
    try {
      await control.engine.resume();
    } catch (e) {
      resumeError = (e as Error).message;
    }
    if (resumeError) return failed(`the resume failed: ${resumeError}; the engine may still be paused: POST /resume (vLLM) or /continue_generation (SGLang) by hand`);
    const after = this.vllm ? (await control.engine.status()).replicas : [];
    const notPaused = during.filter((r) => r.paused !== true).map((r) => r.url);
    if (notPaused.length > 0) return this.set("pause/resume", "mismatch", `POST /pause answered, but GET /is_paused did not say true at ${notPaused.join(", ")}`);
    const stillPaused = after.filter((r) => r.paused !== false).map((r) => r.url);
    if (stillPaused.length > 0) return this.set("pause/resume", "mismatch", `POST /resume answered, but GET /is_paused did not say false at ${stillPaused.join(", ")}: resume it by hand`);
    const n = control.targets.length > 1 ? ` at ${control.targets.length} replicas (engine.admin_urls)` : "";
    // A generate call that failed before the pause (see generate) fails after it too: that is not the pause's fault.
    if (!served) {
      return this.set("pause/resume", "warn", `POST /pause?mode=abort and /resume answered${n}; GET /is_paused said true, then false; no call was tried after (the generate call fails, see generate)`);
    }
    const { client } = this.client();
    try {
      await client.generate(this.request({ maxTokens: 1 }));
    } catch (e) {
      return this.set("pause/resume", "mismatch", `after the resume a call failed: ${this.reason(e)}`);
    }
    this.set(
      "pause/resume",
      "ok",
      this.vllm
        ? `POST /pause?mode=abort and /resume answered${n}; GET /is_paused said true, then false; a call was served after`
        : `POST /pause_generation {"mode":"abort"} and /continue_generation {} answered${n}; a call was served after (SGLang has no is_paused to read back)`,
    );
  }

  private controlFailure(url: string, path: string, status: number, error?: string): void {
    const where = this.o.config.engine.admin_urls ? ` at ${url}` : "";
    // Without engine.admin_urls the control calls went to engine.url: edgeloop's gateway there forwards none of them.
    if (status === 404 && this.viaGateway && !this.o.config.engine.admin_urls) {
      return this.set("pause/resume", "missing", `${path} is HTTP 404 from edgeloop's gateway at ${url}, which forwards no engine control: set engine.admin_urls to the replicas' own URLs (doctor and POST /v1/engine/pause reach each one there)`);
    }
    if (status === 404 && this.vllm) return this.set("pause/resume", "missing", `${path} is HTTP 404${where}: start vLLM with VLLM_SERVER_DEV_MODE=1 (it mounts /pause, /resume and /is_paused)`);
    if (status === 404) return this.set("pause/resume", "missing", `${path} is HTTP 404${where}: this SGLang has no pause API (POST /pause_generation, /continue_generation): use a newer SGLang`);
    if ((status === 401 || status === 403) && this.vllm) {
      // vLLM's own --api-key guards only its API routes (/v1, /v2, /inference, …): a refusal of /pause or /is_paused comes from something in front of it.
      if (this.controlKey) {
        const which = this.o.config.engine.admin_api_key ? "engine.admin_api_key" : "engine.api_key";
        return this.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}: the key sent there (${which}) was refused; vLLM's --api-key does not guard its control routes, so a proxy in front wants another key: set engine.admin_api_key to it, or engine.admin_urls to the engines' own URLs`);
      }
      return this.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: a key is wanted there (vLLM's --api-key does not guard its control routes: a proxy in front?): set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)`);
    }
    if (status === 401 || status === 403) {
      const admin = this.o.config.engine.admin_api_key;
      if (!this.vllm && !admin) return this.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: the control routes want SGLang's --admin-api-key: set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)`);
      if (admin) return this.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}: the server refused engine.admin_api_key: set it to the server's --admin-api-key`);
      return this.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: the server wants an API key: set EDGELOOP_ENGINE_API_KEY (or --engine-api-key, engine.api_key) to its --api-key`);
    }
    this.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}${error ? `: ${error}` : ""}`);
  }

  /** Requests running or waiting at a replica, or why doctor cannot tell. */
  private async running(url: string): Promise<number | { unknown: string }> {
    if (!this.vllm) {
      const r = await this.call(joinUrl(url, "/get_load"), "GET");
      if (!("error" in r) && r.status >= 200 && r.status < 300) {
        const list = Array.isArray(r.body) ? r.body : [r.body];
        const counts = list.map((x) => (x as { num_reqs?: unknown } | null)?.num_reqs);
        if (counts.length > 0 && counts.every((c) => typeof c === "number" && Number.isFinite(c))) return (counts as number[]).reduce((a, b) => a + b, 0);
      }
    }
    const names = this.vllm ? ["vllm:num_requests_running", "vllm:num_requests_waiting"] : ["sglang:num_running_reqs", "sglang:num_queue_reqs"];
    const m = await this.call(joinUrl(url, "/metrics"), "GET");
    if ("error" in m) return { unknown: `GET /metrics: ${m.error}` };
    if (m.status < 200 || m.status >= 300) return { unknown: `GET /metrics is HTTP ${m.status}${this.vllm ? "" : " and /get_load gives no num_reqs"}` };
    const n = prometheusSum(m.text, names);
    return n ?? { unknown: `GET /metrics has no ${names[0]}${this.vllm ? "" : " (start SGLang with --enable-metrics)"}` };
  }
}

/** Index of the first position where `a` and `b` differ (a length difference counts at the shorter end), −1 when equal. */
function firstDifference(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

/** The reply's `text` (vLLM completions `choices[0].text`, SGLang `text`); the generate endpoint has none (it does not detokenize). */
function replyText(format: AppConfig["engine"]["format"], body: unknown): string | undefined {
  const b = (body ?? {}) as Record<string, unknown>;
  if (format === "vllm-generate") return undefined;
  const t = format === "sglang" ? b.text : ((b.choices as unknown[] | undefined)?.[0] as Record<string, unknown> | undefined)?.text;
  return typeof t === "string" ? t : undefined;
}

/**
 * Whether `ids` decode through `tok` to the engine's `text`: with or without
 * the final stop id (vLLM leaves a stop token's text out) and special tokens,
 * and, as a last resort, ignoring whitespace (engines space special tokens
 * their own way); another tokenizer's decode differs in its words.
 */
export function decodesTo(tok: ChatTokenizer, ids: readonly number[], text: string): boolean {
  const variants: (readonly number[])[] = [ids];
  if (ids.length > 0 && tok.isStopToken(ids[ids.length - 1])) variants.push(ids.slice(0, -1));
  const squash = (s: string) => s.replace(/\s+/g, "");
  for (const v of variants) {
    for (const skipSpecialTokens of [false, true]) {
      let d: string;
      try {
        d = tok.decode(v, { skipSpecialTokens });
      } catch {
        continue;
      }
      if (d === text || squash(d) === squash(text)) return true;
    }
  }
  return false;
}

/**
 * The sum of the samples of the named metrics in a Prometheus text page
 * (`name{labels} value` or `name value`), or null when none of them appears.
 * One pass over the lines.
 */
export function prometheusSum(page: string, names: readonly string[]): number | null {
  let sum = 0;
  let seen = false;
  for (const line of page.split("\n")) {
    if (line.startsWith("#")) continue;
    for (const name of names) {
      if (!line.startsWith(name)) continue;
      const next = line.charAt(name.length);
      if (next !== "{" && next !== " ") continue;
      const rest = next === "{" ? line.slice(line.indexOf("}", name.length) + 1) : line.slice(name.length);
      const value = Number(rest.trim().split(/\s+/)[0]);
      if (Number.isFinite(value)) {
        sum += value;
        seen = true;
      }
    }
  }
  return seen ? sum : null;
}
