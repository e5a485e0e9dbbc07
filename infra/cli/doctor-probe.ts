import type { AppConfig } from "../../shared/config/app-config.ts";
import { DEFAULT_ENGINE_MAX_REPLY_BYTES, readTextCapped, redactUrl } from "../../shared/http/outbound.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import { EngineControl, MemoryEngineGate, type EngineReplicaTarget } from "../../shared/inference/engine-control.ts";
import { DEADLINE_HEADER, joinUrl, VLLM_GENERATE_PATH, type FetchLike } from "../../shared/inference/engine-http.ts";
import { parseSglangReply } from "../../shared/inference/sglang-client.ts";
import type { TeacherClient } from "../../shared/inference/teacher-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { parseCompletionReply, parseGenerateReply } from "../../shared/inference/vllm-client.ts";
import type { TokenOutput } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/** The checks of `edgeloop doctor`, in the order they are printed (one line each, always all of them). */
export const DOCTOR_CHECKS = ["reachable", "auth", "models", "generate", "token ids", "log-probs", "tokenizer", "stop ids", "cached tokens", "pause/resume", "routed experts", "teacher"] as const;
/** One check of {@link DOCTOR_CHECKS}, by its printed name. */
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

/** What `runDoctor` (doctor-checks.ts) probes and with what. */
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
export const ROUTING_KEY = "edgeloop-doctor";

/** One engine reply as doctor recorded it: status, text, parsed JSON body (undefined when not JSON). */
export interface HttpReply {
  status: number;
  text: string;
  body: unknown;
  headers?: Headers;
}
/** A reply, or the error text when nothing answered. */
export type Got = HttpReply | { error: string };

/**
 * What every doctor check works with: the engine's settings, the lines set
 * so far (the first status set for a check stands), one bounded HTTP call,
 * a recording client of edgeloop's own adapter, the probe request and the
 * pause control. `Doctor` (doctor-checks.ts) runs the checks on it.
 */
export class DoctorProbe {
  readonly lines = new Map<DoctorCheck, DoctorLine>();
  readonly refused: string[] = [];
  readonly f: FetchLike;
  readonly url: string;
  readonly format: AppConfig["engine"]["format"];
  readonly vllm: boolean;
  readonly apiKey: string | null;
  readonly controlKey: string | null;
  readonly name: string;
  readonly prompt: number[];
  readonly path: string;
  /** Whether `engine.url` is edgeloop's own gateway (its `/health` carries `x-edgeloop-gateway`): it forwards no engine control. */
  viaGateway = false;

  constructor(readonly o: DoctorOptions) {
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

  /** Sets a check's line unless one is set already (the first status stands). */
  set(check: DoctorCheck, status: DoctorStatus, detail: string): void {
    if (!this.lines.has(check)) this.lines.set(check, { check, status, detail });
  }

  /** Every check not yet set: `skipped` with `detail`. */
  skipRest(detail: string): void {
    for (const c of DOCTOR_CHECKS) this.set(c, "skipped", detail);
  }

  /** One line per {@link DOCTOR_CHECKS} entry, in order (an unset one `skipped`). */
  result(): DoctorLine[] {
    return DOCTOR_CHECKS.map((c) => this.lines.get(c) ?? { check: c, status: "skipped", detail: "" });
  }

  /** One HTTP call with the deadline; the error text instead of a throw when nothing answers. */
  async call(url: string, method: "GET" | "POST", body?: unknown, key: string | null = this.apiKey): Promise<Got> {
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
  wasRefused(what: string, status: number): boolean {
    if (status !== 401 && status !== 403) return false;
    this.refused.push(`${what} ${status}`);
    return true;
  }

  /**
   * The pause control over `engine.admin_urls` (else `engine.url`); `failed`
   * holds each target's first non-2xx answer since it was last cleared (a
   * failed pause is rolled back by a resume, whose answer must not hide the pause's).
   */
  control(): { engine: EngineControl; targets: EngineReplicaTarget[]; failed: Map<string, { path: string; status: number }> } {
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

  /** A client of edgeloop's own adapter whose every reply is recorded (status, text, parsed body). */
  client(): { client: InferenceClient; last: () => HttpReply | undefined } {
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

  /** The probe call: the rendered {@link DOCTOR_PROMPT}, greedy, the tokenizer's stop ids, log-probs, at most {@link DOCTOR_MAX_TOKENS} tokens. */
  request(opts: { maxTokens?: number; experts?: boolean } = {}): GenerateRequest {
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
  parse(body: unknown, wantLogprobs: boolean): TokenOutput | Error {
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
  reason(e: unknown): string {
    const m = (e as Error)?.message ?? String(e);
    const lead = `engine at ${joinUrl(this.url, this.path)} sent an unusable reply: `;
    return m.startsWith(lead) ? m.slice(lead.length) : m;
  }
}
