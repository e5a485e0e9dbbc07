import { Hono, type Context } from "hono";
import type { z } from "zod";
import { SimEngine, SimEngineFault, type SimEngineOptions, type SimGenerateRequest, type SimGenerateResult } from "./sim-engine.ts";
import {
  decodeText,
  sglangSamplingProblem,
  vllmSamplingProblem,
  type SimEngineVersion,
  SglangGenerateRequest,
  sglangError,
  sglangFault,
  sglangReply,
  stopList,
  TokenizeRequest,
  VllmCompletionRequest,
  vllmCompletionReply,
  vllmError,
  vllmFault,
  VllmGenerateRequest,
  vllmGenerateReply,
} from "./wire.ts";
import { sglangInputTokenLogprobs, vllmPromptLogprobsBody } from "./prompt-logprobs.ts";
import { sglangStream, streamReply, vllmCompletionStream, vllmGenerateStream } from "./stream-wire.ts";
import { sglangImageProblem } from "./images.ts";

type Rendered = { status: number; body: unknown };
type Format = { error: (status: number, message: string) => Rendered; fault: (f: SimEngineFault) => Rendered };
const SGLANG: Format = { error: sglangError, fault: sglangFault };

/**
 * How the simulated server was started: the engine version it plays and the
 * server flags that change its wire (each default is the setting edgeloop's
 * docs ask a real server to run with).
 * @see docs/engines.md §2.10–2.11, §3.7 and §5
 */
export interface SimWireOptions {
  /** The vLLM version played on the vLLM endpoints (default `main`). */
  engineVersion?: SimEngineVersion;
  /** The server's `--api-key`: every guarded route then wants `Authorization: Bearer <key>` (401 `{"error":"Unauthorized"}` otherwise). */
  apiKey?: string | null;
  /** SGLang's `--admin-api-key`: its control routes then take this key only. */
  adminApiKey?: string | null;
  /** vLLM `--enable-prompt-tokens-details` (default true): `usage.prompt_tokens_details.cached_tokens` in replies. */
  promptTokensDetails?: boolean;
  /** vLLM `--enable-scale-out` / `VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1` (default true): `/inference/v1/generate` is mounted. */
  scaleOut?: boolean;
  /** SGLang `--incremental-streaming-output` (default false): `/generate` stream events carry the new tokens only, not everything so far. */
  sglangIncrementalStreaming?: boolean;
}

/**
 * Paths vLLM's `--api-key` guards (`serve/middleware/authenticate.py`
 * `GUARDED_PREFIX`, 0.2x and main): `/tokenize`, `/health` and the dev
 * routes (`/pause`, `/resume`, `/is_paused`) stay open.
 */
const VLLM_GUARDED = /^\/(v1|v2|inference|cohere)(\/|$)/;
/** SGLang routes marked `ADMIN_OPTIONAL` (the control plane): the admin key when the server has one, else the API key. */
const SGLANG_ADMIN = new Set(["/pause_generation", "/continue_generation", "/flush_cache", "/update_weight_version", "/update_weights_from_disk"]);
/** SGLang's other routes (`NORMAL`): the API key when the server has one. */
const SGLANG_NORMAL = new Set(["/generate", "/get_weight_version", "/v1/tokenize", "/v1/detokenize"]);

/**
 * The key a request to `path` must carry, or null when the route is open:
 * SGLang's `decide_request_auth` for SGLang routes (health and metrics always
 * open; `ADMIN_OPTIONAL` → admin key, else API key; `NORMAL` → API key),
 * vLLM's prefix guard for the rest.
 * @see docs/engines.md §2.10 (vLLM) and §3.7 (SGLang `python/sglang/srt/utils/auth.py`)
 */
export function simRequiredKey(path: string, o: SimWireOptions): string | null {
  if (path.startsWith("/health") || path.startsWith("/metrics")) return null;
  if (SGLANG_ADMIN.has(path)) return o.adminApiKey ?? o.apiKey ?? null;
  if (SGLANG_NORMAL.has(path)) return o.apiKey ?? null;
  return VLLM_GUARDED.test(path) ? (o.apiKey ?? null) : null;
}

/** `Authorization: Bearer <expected>` (scheme case-insensitive, as both engines compare it). */
function bearerMatches(header: string | undefined, expected: string): boolean {
  if (!header) return false;
  const sp = header.indexOf(" ");
  if (sp < 0 || header.slice(0, sp).toLowerCase() !== "bearer") return false;
  const got = new TextEncoder().encode(header.slice(sp + 1));
  const want = new TextEncoder().encode(expected);
  let diff = got.length ^ want.length;
  for (let i = 0; i < want.length; i++) diff |= (got[i] ?? 0) ^ want[i]!;
  return diff === 0;
}

/**
 * The simulated engine's HTTP API as a runtime-neutral Hono app (serve it
 * with `startSimEngine`, `Deno.serve(app.fetch)`, or call `app.fetch`
 * in-process). Endpoints: vLLM `POST /v1/completions` (token-id or text
 * prompt), `POST /inference/v1/generate`; SGLang `POST /generate`;
 * `GET /health` (200 empty, 503 when `engine.healthy` is false);
 * `GET /v1/models` (with `max_model_len`); `POST /tokenize` / `/v1/tokenize`,
 * `POST /detokenize` / `/v1/detokenize`; `POST /reset_prefix_cache`, `/flush_cache`.
 * Scoring (a teacher's calls): vLLM `prompt_logprobs` (completions and
 * generate), SGLang `max_new_tokens: 0` with `logprob_start_len` ≥ 0
 * (`input_token_logprobs`); see `prompt-logprobs.ts`.
 * `stream: true` on the three generation endpoints answers each engine's
 * event stream at the decode pace (`stream-wire.ts`, docs/engines.md §7).
 * The routing key (`X-Session-ID`, else `X-SMG-Routing-Key`) goes to the request log.
 * Any model name is accepted. Pass a {@link SimEngine} (to keep a handle on
 * its cache, faults and request log) or the options to build one.
 * @see infra/sim-engine/README.md
 */
export function createSimEngineApp(engineOrOptions: SimEngine | SimEngineOptions, wire: SimWireOptions = {}): Hono {
  const engine = engineOrOptions instanceof SimEngine ? engineOrOptions : new SimEngine(engineOrOptions);
  const version = wire.engineVersion ?? "main";
  const details = wire.promptTokensDetails ?? true;
  const VLLM: Format = { error: (s, m) => vllmError(s, m), fault: (f) => vllmFault(f, version) };
  const app = new Hono();

  app.use("*", async (c, next) => {
    const key = c.req.method === "OPTIONS" ? null : simRequiredKey(c.req.path, wire);
    if (key !== null && !bearerMatches(c.req.header("authorization"), key)) return c.json({ error: "Unauthorized" }, 401);
    await next();
  });

  app.get("/health", (c) => (engine.healthy ? c.body(null, 200) : c.body(null, 503)));

  // Prometheus gauges of the running batch and the waiting queue, under both engines' names (vLLM
  // `vllm:num_requests_running`/`_waiting`; SGLang `sglang:num_running_reqs`/`num_queue_reqs`, with --enable-metrics).
  app.get("/metrics", (c) => {
    const running = engine.running;
    const waiting = engine.pending - running;
    const label = `{model_name=${JSON.stringify(engine.model)}}`;
    const gauge = (name: string, help: string, v: number) => `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}${label} ${v}\n`;
    return c.text(
      gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running) +
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting) +
        gauge("sglang:num_running_reqs", "The number of running requests.", running) +
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting),
      200,
      { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
    );
  });

  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: [
        {
          id: engine.model,
          object: "model",
          created: 0,
          owned_by: "edgeloop-sim",
          root: engine.model,
          parent: null,
          max_model_len: engine.maxModelLen,
          permission: [],
        },
      ],
    }),
  );

  app.post("/v1/completions", async (c) => {
    const body = await parse(c, VllmCompletionRequest, VLLM);
    if (body instanceof Response) return body;
    const bad = vllmSamplingProblem(body);
    if (bad) return send(c, vllmError(400, bad));
    const prompt = typeof body.prompt === "string" ? engine.tokenizer.encode(body.prompt) : body.prompt;
    const requestId = body.request_id ?? c.req.header("x-request-id") ?? crypto.randomUUID();
    const core = {
      request_id: requestId,
      prompt_ids: prompt,
      max_tokens: body.max_tokens ?? 16,
      stop_token_ids: body.stop_token_ids ?? undefined,
      stop: stopList(body.stop),
      endpoint: "/v1/completions",
    };
    if (body.stream === true) {
      return streamReply(engine, { ...core, ...callerOf(c) }, vllmCompletionStream(engine, {
        requestId,
        promptIds: prompt,
        logprobs: body.logprobs != null,
        returnTokenIds: body.return_token_ids === true,
        asTokenIds: body.return_tokens_as_token_ids === true,
        skipSpecial: body.skip_special_tokens ?? true,
        includeUsage: body.stream_options?.include_usage === true,
        promptTokensDetails: details,
        version,
      }));
    }
    const out = await run(c, engine, VLLM, core);
    if (out instanceof Response) return out;
    return c.json(
      withPromptLogprobs(engine, prompt, body.prompt_logprobs, vllmCompletionReply(engine, out, {
        requestId,
        promptIds: prompt,
        logprobs: body.logprobs != null,
        returnTokenIds: body.return_token_ids === true,
        asTokenIds: body.return_tokens_as_token_ids === true,
        promptTokensDetails: details,
        skipSpecial: body.skip_special_tokens ?? true,
        includeStopStr: body.include_stop_str_in_output ?? false,
      })),
    );
  });

  app.post("/inference/v1/generate", async (c) => {
    // Mounted only with --enable-scale-out (main) / VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (0.2x): FastAPI's 404 otherwise.
    if (wire.scaleOut === false) return c.json({ detail: "Not Found" }, 404);
    const body = await parse(c, VllmGenerateRequest, VLLM);
    if (body instanceof Response) return body;
    const bad = vllmSamplingProblem(body.sampling_params);
    if (bad) return send(c, vllmError(400, bad));
    const requestId = body.request_id ?? c.req.header("x-request-id") ?? crypto.randomUUID();
    const sp = body.sampling_params;
    const core = {
      request_id: requestId,
      prompt_ids: body.token_ids,
      max_tokens: sp.max_tokens ?? 16,
      stop_token_ids: sp.stop_token_ids ?? undefined,
      stop: stopList(sp.stop),
      endpoint: "/inference/v1/generate",
    };
    if (body.stream === true) {
      return streamReply(engine, { ...core, ...callerOf(c) }, vllmGenerateStream({
        requestId,
        promptIds: body.token_ids,
        logprobs: sp.logprobs != null,
        returnTokenIds: true,
        asTokenIds: true,
        skipSpecial: false,
        includeUsage: body.stream_options?.include_usage === true,
        promptTokensDetails: details,
        version,
      }));
    }
    const out = await run(c, engine, VLLM, core);
    if (out instanceof Response) return out;
    const reply = vllmGenerateReply(out, { requestId, logprobs: sp.logprobs != null, version, promptTokensDetails: details });
    if (sp.prompt_logprobs != null) reply.prompt_logprobs = vllmPromptLogprobsBody(engine, body.token_ids);
    return c.json(reply);
  });

  app.post("/generate", async (c) => {
    const body = await parse(c, SglangGenerateRequest, SGLANG);
    if (body instanceof Response) return body;
    if ((body.input_ids == null) === (body.text == null)) {
      return send(c, sglangError(400, "Either text or input_ids should be provided (exactly one)."));
    }
    const problem = sglangSamplingProblem(body.sampling_params as Record<string, unknown>);
    if (problem) return send(c, sglangError(400, problem));
    const prompt = body.input_ids ?? engine.tokenizer.encode(body.text!);
    if (body.image_data != null) {
      const problem = await sglangImageProblem(engine.tokenizer, prompt, body.input_ids != null, typeof body.image_data === "string" ? [body.image_data] : body.image_data);
      if (problem) return send(c, sglangError(400, problem));
    }
    const rid = body.rid ?? crypto.randomUUID().replaceAll("-", "");
    const sp = body.sampling_params;
    const started = performance.now();
    const core = {
      request_id: rid,
      prompt_ids: prompt,
      max_tokens: sp.max_new_tokens ?? 128,
      stop_token_ids: sp.stop_token_ids ?? undefined,
      stop: stopList(sp.stop),
      endpoint: "/generate",
      context_rule: "sglang" as const,
    };
    if (body.stream === true) {
      const start = body.logprob_start_len ?? -1;
      return streamReply(engine, { ...core, ...callerOf(c) }, sglangStream(engine, {
        rid,
        logprob: body.return_logprob === true,
        skipSpecial: sp.skip_special_tokens ?? true,
        noStopTrim: sp.no_stop_trim ?? false,
        promptTokens: prompt.length,
        started,
        incremental: wire.sglangIncrementalStreaming === true,
        ...(body.return_logprob === true && start >= 0 ? { finalMeta: () => ({ input_token_logprobs: sglangInputTokenLogprobs(engine, prompt, start) }) } : {}),
      }));
    }
    const out = await run(c, engine, SGLANG, core);
    if (out instanceof Response) return out;
    const reply = sglangReply(engine, out, {
        rid,
        logprob: body.return_logprob === true,
        skipSpecial: sp.skip_special_tokens ?? true,
        noStopTrim: sp.no_stop_trim ?? false,
        latencyS: Math.round(performance.now() - started) / 1000,
        weightVersion: out.weight_version,
        ...(body.return_routed_experts === true ? { routedExpertsFor: prompt } : {}),
      });
    const start = body.logprob_start_len ?? -1;
    if (body.return_logprob === true && start >= 0) (reply.meta_info as Record<string, unknown>).input_token_logprobs = sglangInputTokenLogprobs(engine, prompt, start);
    return c.json(reply);
  });

  const tokenize = (shape: "vllm" | "sglang") => async (c: Context) => {
    const body = await parse(c, TokenizeRequest, shape === "vllm" ? VLLM : SGLANG);
    if (body instanceof Response) return body;
    let tokens: number[];
    if (body.messages) {
      tokens = engine.tokenizer.renderIds(body.messages as never, { addGenerationPrompt: body.add_generation_prompt ?? true });
    } else if (typeof body.prompt === "string") tokens = engine.tokenizer.encode(body.prompt);
    else return send(c, (shape === "vllm" ? VLLM : SGLANG).error(400, "prompt or messages is required"));
    return c.json({
      count: tokens.length,
      max_model_len: engine.maxModelLen,
      tokens,
      ...(body.return_token_strs ? { token_strs: tokens.map((t) => engine.tokenizer.idToToken(t) ?? null) } : {}),
    });
  };
  app.post("/tokenize", tokenize("vllm"));
  app.post("/v1/tokenize", tokenize("sglang"));

  const detokenize = (key: "prompt" | "text") => async (c: Context) => {
    const body = (await c.req.json().catch(() => undefined)) as { tokens?: unknown } | undefined;
    if (!body || !Array.isArray(body.tokens) || !body.tokens.every((t) => Number.isInteger(t) && t >= 0)) {
      return send(c, key === "prompt" ? vllmError(400, "tokens: expected a list of token ids") : sglangError(400, "tokens: expected a list of token ids"));
    }
    return c.json({ [key]: decodeText(engine, body.tokens as number[]) });
  };
  app.post("/detokenize", detokenize("prompt"));
  app.post("/v1/detokenize", detokenize("text"));

  app.post("/reset_prefix_cache", (c) => {
    engine.cache.clear();
    return c.body(null, 200);
  });
  // SGLang flushes only an idle scheduler: nothing waiting, nothing in the running batch (frozen requests included).
  app.on(["GET", "POST"], "/flush_cache", (c) => {
    if (engine.pending > 0) return c.text(`Cache not flushed because there are pending requests. #queue-req: 0, #running-req: ${engine.pending}`, 400);
    engine.cache.clear();
    return c.text("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n");
  });

  // Pause and resume, in both engines' forms (per replica).
  // vLLM (dev/RL server, VLLM_SERVER_DEV_MODE=1): POST /pause?mode=abort|wait|keep&clear_cache=true|false
  // → {"status":"paused"}; POST /resume → {"status":"resumed"}; GET /is_paused → {"is_paused": bool}.
  // @see https://docs.vllm.ai/en/latest/training/async_rl/ and vllm/entrypoints/serve/rlhf/api_router.py
  app.post("/pause", async (c) => {
    const mode = c.req.query("mode") ?? "abort";
    if (mode !== "abort" && mode !== "wait" && mode !== "keep") return send(c, vllmError(400, `mode: must be one of abort, wait, keep; got '${mode}'`, "mode"));
    const cc = c.req.query("clear_cache");
    if (cc !== undefined && !/^(true|false|1|0)$/i.test(cc)) return send(c, vllmError(400, `clear_cache: must be a boolean; got '${cc}'`, "clear_cache"));
    await engine.pause(mode, cc === undefined ? false : /^(true|1)$/i.test(cc));
    return c.json({ status: "paused" });
  });
  app.post("/resume", (c) => {
    engine.resume();
    return c.json({ status: "resumed" });
  });
  app.get("/is_paused", (c) => c.json({ is_paused: engine.paused }));
  // SGLang: POST /pause_generation {"mode": "abort"|"in_place"|"retract"}, POST /continue_generation;
  // POST /update_weight_version {"new_version", "abort_all_requests"}; GET /get_weight_version.
  // @see sglang/srt/entrypoints/http_server.py (PauseGenerationReqInput, UpdateWeightVersionReqInput)
  app.post("/pause_generation", async (c) => {
    const body = await sglangBody(c);
    if (body instanceof Response) return body;
    const mode = body.mode ?? "abort";
    if (mode !== "abort" && mode !== "in_place" && mode !== "retract") return send(c, sglangError(400, `mode: must be one of abort, in_place, retract; got ${JSON.stringify(mode)}`));
    await engine.pause(mode);
    return c.json({ message: "Generation paused successfully." });
  });
  app.post("/continue_generation", async (c) => {
    const body = await sglangBody(c);
    if (body instanceof Response) return body;
    engine.resume();
    return c.json({ message: "Generation continued successfully." });
  });
  // `abort_all_requests` defaults to true here: every request not yet answered ends `abort`, frozen ones too.
  app.post("/update_weight_version", async (c) => {
    const body = await sglangBody(c);
    if (body instanceof Response) return body;
    if (typeof body.new_version !== "string" || body.new_version === "") return send(c, sglangError(400, "new_version: expected a non-empty string"));
    if (body.abort_all_requests !== false) engine.abortAll();
    engine.weightVersion = body.new_version;
    return c.json({ success: true, message: `Weight version updated to ${body.new_version}`, new_version: body.new_version });
  });
  // A weight update (the trainer's call, simulated): `flush_cache` defaults to true and the scheduler asserts the
  // flush worked, so with requests pending (frozen in place, retracted or running) the simulated scheduler dies.
  app.post("/update_weights_from_disk", async (c) => {
    const body = await sglangBody(c);
    if (body instanceof Response) return body;
    if (typeof body.model_path !== "string" || body.model_path === "") return send(c, sglangError(400, "model_path: expected a non-empty string"));
    if (body.abort_all_requests === true) {
      engine.abortAll();
      await engine.whenNoPending();
    }
    if (body.flush_cache !== false) {
      if (engine.pending > 0) {
        engine.kill(`AssertionError: Cache flush failed after updating weights (#running-req: ${engine.pending})`);
        return send(c, sglangError(500, `the scheduler died: ${engine.dead}`));
      }
      engine.cache.clear();
    }
    if (typeof body.weight_version === "string" && body.weight_version !== "") engine.weightVersion = body.weight_version;
    return c.json({ success: true, message: "Succeeded to update model weights.", num_paused_requests: 0 });
  });
  app.get("/get_weight_version", (c) => c.json({ weight_version: engine.weightVersion }));

  app.notFound((c) => c.json({ detail: "Not Found" }, 404));
  app.onError((e, c) => send(c, vllmError(500, `simulated engine error: ${e.message}`)));
  return app;
}

/** A `/v1/completions` reply with `choices[0].prompt_logprobs` filled when the request asked for them. */
function withPromptLogprobs(engine: SimEngine, prompt: readonly number[], asked: number | null | undefined, reply: Record<string, unknown>): Record<string, unknown> {
  if (asked == null) return reply;
  const choices = reply.choices as Record<string, unknown>[];
  choices[0]!.prompt_logprobs = vllmPromptLogprobsBody(engine, prompt);
  return reply;
}

function send(c: Context, r: Rendered): Response {
  return c.json(r.body as object, r.status as 400);
}

/**
 * An SGLang control route's body: FastAPI validates a JSON object there
 * (`Annotated[…ReqInput, Body()]`), so a missing or non-object body is a 400
 * naming the missing body, as SGLang's validation handler answers it.
 * @see SGLang `http_server.py` `continue_generation`, `pause_generation`; docs/engines.md §3.4
 */
async function sglangBody(c: Context): Promise<Record<string, unknown> | Response> {
  const text = await c.req.text();
  let raw: unknown;
  try {
    raw = text === "" ? undefined : JSON.parse(text);
  } catch {
    raw = undefined;
  }
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    return send(c, sglangError(400, "[{'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}]"));
  }
  return raw as Record<string, unknown>;
}

/** Parses a JSON body with `schema`; a 400 in the engine's error shape naming the field on failure. */
async function parse<S extends z.ZodType>(c: Context, schema: S, fmt: Format): Promise<z.infer<S> | Response> {
  let raw: unknown;
  try {
    raw = await c.req.json();
  } catch {
    return send(c, fmt.error(400, "request body is not valid JSON"));
  }
  const r = schema.safeParse(raw);
  if (!r.success) {
    const first = r.error.issues[0];
    return send(c, fmt.error(400, `${first?.path.join(".") || "body"}: ${first?.message}`));
  }
  return r.data;
}

/** The caller's routing key (`X-Session-ID`, else `X-SMG-Routing-Key`) and its connection's signal. */
function callerOf(c: Context): Pick<SimGenerateRequest, "routing_key" | "signal"> {
  return { routing_key: c.req.header("x-session-id") ?? c.req.header("x-smg-routing-key"), signal: c.req.raw.signal };
}

/** Runs the core, rendering a {@link SimEngineFault} in the endpoint's wire format. */
async function run(c: Context, engine: SimEngine, fmt: Format, req: Omit<SimGenerateRequest, "signal" | "routing_key">): Promise<SimGenerateResult | Response> {
  try {
    return await engine.generate({ ...req, ...callerOf(c) });
  } catch (e) {
    if (e instanceof SimEngineFault) return send(c, fmt.fault(e));
    throw e;
  }
}

