import { ContextOverflowError, EngineAbortedError, EngineUnavailableError } from "../../shared/errors.ts";
import { finishOutput } from "../../shared/inference/finish-output.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import type { RoutedExpertsSpan, TokenOutput } from "../../shared/schema/index.ts";
import { SimEngine, SimEngineFault } from "./sim-engine.ts";
import { vllmFault } from "./wire.ts";

/**
 * An in-process {@link InferenceClient} over a {@link SimEngine}: the same
 * core as the HTTP endpoints, without HTTP, for fast in-process runs. Output
 * follows vLLM's conventions (`stop_reason` is the matched stop string, or the
 * stop id when it was requested in `stop_token_ids`); routed experts (when
 * requested) cover what SGLang's `/generate` covers; faults become the typed errors the HTTP
 * adapters would throw for the same engine answer.
 * @throws ContextOverflowError, EngineUnavailableError, EngineAbortedError
 */
export class SimEngineClient implements InferenceClient {
  readonly engine: SimEngine;
  private readonly label: string;

  constructor(engine: SimEngine) {
    this.engine = engine;
    this.label = `sim:${engine.name}`;
  }

  /** One generation call on the engine. */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    let out;
    try {
      out = await this.engine.generate({
        request_id: req.request_id,
        routing_key: req.routing_key,
        prompt_ids: Array.from(req.prompt_ids),
        max_tokens: req.max_tokens,
        stop_token_ids: req.sampling_params.stop_token_ids,
        stop: req.sampling_params.stop,
        endpoint: "in-process",
        signal: req.signal,
      });
    } catch (e) {
      if (!(e instanceof SimEngineFault)) throw e;
      const what = `engine at ${this.label} failed: ${messageOf(vllmFault(e).body) ?? e.message}`;
      if (e.kind === "context_overflow") throw new ContextOverflowError(what, { status: 400, cause: e });
      if (e.kind === "client_gone") throw new EngineAbortedError(what, { cause: e });
      throw new EngineUnavailableError(what, { cause: e });
    }
    return finishOutput(this.label, {
      ids: out.token_ids,
      logProbs: out.log_probs,
      wantLogprobs: req.sampling_params.logprobs,
      finishReason: out.finish_reason,
      stopReason: out.finish_reason === "stop" ? (out.stop_string ?? (out.stop_token_requested ? out.stop_token : null)) : null,
      cachedTokens: out.cached_tokens,
      ...(req.return_routed_experts ? { routedExperts: this.routedExperts(req.prompt_ids, out.token_ids) } : {}),
    });
  }

  /** The experts SGLang's wire form would carry for this call: positions `0 … P + C − 2` of input ‖ output. */
  private routedExperts(input: ArrayLike<number>, output: readonly number[]): RoutedExpertsSpan {
    const stream = [...Array.from(input), ...output];
    const tokens = Math.max(0, stream.length - 1);
    const m = this.engine.moe;
    return { data: this.engine.routedExperts(stream, tokens), shape: [m.layers, m.top_k], start: 0, tokens };
  }

  /** The engine's `max_model_len`. */
  async maxModelLen(): Promise<number> {
    return this.engine.maxModelLen;
  }
}

function messageOf(body: unknown): string | undefined {
  const m = (body as { error?: { message?: unknown } })?.error?.message;
  return typeof m === "string" ? m : undefined;
}

