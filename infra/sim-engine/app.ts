import { Hono, type Context } from "hono";
import type { z } from "zod";
import { SimEngine, SimEngineFault, type SimEngineOptions, type SimGenerateRequest, type SimGenerateResult } from "./sim-engine.ts";
import {
  decodeText,
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

type Rendered = { status: number; body: unknown };
type Format = { error: (status: number, message: string) => Rendered; fault: (f: SimEngineFault) => Rendered };
const VLLM: Format = { error: (s, m) => vllmError(s, m), fault: vllmFault };
const SGLANG: Format = { error: sglangError, fault: sglangFault };

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
 * The routing key (`X-Session-ID`, else `X-SMG-Routing-Key`) goes to the request log.
 * Any model name is accepted. Pass a {@link SimEngine} (to keep a handle on
 * its cache, faults and request log) or the options to build one.
 * @see infra/sim-engine/README.md
 */
export function createSimEngineApp(engineOrOptions: SimEngine | SimEngineOptions): Hono {
  const engine = engineOrOptions instanceof SimEngine ? engineOrOptions : new SimEngine(engineOrOptions);
  const app = new Hono();

  app.get("/health", (c) => (engine.healthy ? c.body(null, 200) : c.body(null, 503)));

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
    const prompt = typeof body.prompt === "string" ? engine.tokenizer.encode(body.prompt) : body.prompt;
    const requestId = body.request_id ?? c.req.header("x-request-id") ?? crypto.randomUUID();
    const out = await run(c, engine, VLLM, {
      request_id: requestId,
      prompt_ids: prompt,
      max_tokens: body.max_tokens ?? 16,
      stop_token_ids: body.stop_token_ids ?? undefined,
      stop: stopList(body.stop),
      endpoint: "/v1/completions",
    });
    if (out instanceof Response) return out;
    return c.json(
      withPromptLogprobs(engine, prompt, body.prompt_logprobs, vllmCompletionReply(engine, out, {
        requestId,
        promptIds: prompt,
        logprobs: body.logprobs != null,
        returnTokenIds: body.return_token_ids === true,
        asTokenIds: body.return_tokens_as_token_ids === true,
        skipSpecial: body.skip_special_tokens ?? true,
        includeStopStr: body.include_stop_str_in_output ?? false,
      })),
    );
  });

  app.post("/inference/v1/generate", async (c) => {
    const body = await parse(c, VllmGenerateRequest, VLLM);
    if (body instanceof Response) return body;
    const requestId = body.request_id ?? c.req.header("x-request-id") ?? crypto.randomUUID();
    const sp = body.sampling_params;
    const out = await run(c, engine, VLLM, {
      request_id: requestId,
      prompt_ids: body.token_ids,
      max_tokens: sp.max_tokens ?? 16,
      stop_token_ids: sp.stop_token_ids ?? undefined,
      stop: stopList(sp.stop),
      endpoint: "/inference/v1/generate",
    });
    if (out instanceof Response) return out;
    const reply = vllmGenerateReply(out, { requestId, logprobs: sp.logprobs != null });
    if (sp.prompt_logprobs != null) reply.prompt_logprobs = vllmPromptLogprobsBody(engine, body.token_ids);
    return c.json(reply);
  });

  app.post("/generate", async (c) => {
    const body = await parse(c, SglangGenerateRequest, SGLANG);
    if (body instanceof Response) return body;
    if ((body.input_ids == null) === (body.text == null)) {
      return send(c, sglangError(400, "Either text or input_ids should be provided (exactly one)."));
    }
    const prompt = body.input_ids ?? engine.tokenizer.encode(body.text!);
    const rid = body.rid ?? crypto.randomUUID().replaceAll("-", "");
    const sp = body.sampling_params;
    const started = performance.now();
    const out = await run(c, engine, SGLANG, {
      request_id: rid,
      prompt_ids: prompt,
      max_tokens: sp.max_new_tokens ?? 128,
      stop_token_ids: sp.stop_token_ids ?? undefined,
      stop: stopList(sp.stop),
      endpoint: "/generate",
    });
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

  const flush = (c: Context) => {
    engine.cache.clear();
    return c.text("Cache flushed.");
  };
  app.post("/reset_prefix_cache", flush);
  app.on(["GET", "POST"], "/flush_cache", flush);

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
    const body = (await c.req.json().catch(() => ({}))) as { mode?: unknown } | null;
    const mode = body?.mode ?? "abort";
    if (mode !== "abort" && mode !== "in_place" && mode !== "retract") return send(c, sglangError(400, `mode: must be one of abort, in_place, retract; got ${JSON.stringify(mode)}`));
    await engine.pause(mode);
    return c.json({ message: "Generation paused successfully." });
  });
  app.post("/continue_generation", (c) => {
    engine.resume();
    return c.json({ message: "Generation continued successfully." });
  });
  app.post("/update_weight_version", async (c) => {
    const body = (await c.req.json().catch(() => null)) as { new_version?: unknown } | null;
    if (typeof body?.new_version !== "string" || body.new_version === "") return send(c, sglangError(400, "new_version: expected a non-empty string"));
    engine.weightVersion = body.new_version;
    return c.json({ success: true, message: `Weight version updated to ${body.new_version}`, new_version: body.new_version });
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

/** Runs the core, rendering a {@link SimEngineFault} in the endpoint's wire format. */
async function run(c: Context, engine: SimEngine, fmt: Format, req: Omit<SimGenerateRequest, "signal" | "routing_key">): Promise<SimGenerateResult | Response> {
  try {
    return await engine.generate({
      ...req,
      routing_key: c.req.header("x-session-id") ?? c.req.header("x-smg-routing-key"),
      signal: c.req.raw.signal,
    });
  } catch (e) {
    if (e instanceof SimEngineFault) return send(c, fmt.fault(e));
    throw e;
  }
}
