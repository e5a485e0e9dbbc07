import { BadEngineResponseError, ContextOverflowError, EngineAbortedError, EngineUnavailableError } from "../../shared/errors.ts";
import { finishOutput } from "../../shared/inference/finish-output.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import type { RoutedExpertsSpan, TokenOutput } from "../../shared/schema/index.ts";
import { SimEngine, SimEngineFault } from "./sim-engine.ts";
import { vllmFault } from "./wire.ts";
import { sglangImageProblem } from "./images.ts";

/**
 * Shares the event loop between in-process engine calls and everything else
 * (HTTP handlers, health probes, timers). A simulated engine answers without
 * I/O, so a large batch would otherwise run from start to end in microtasks
 * and starve the process (31 s without an answer to `/health` for n = 100,000).
 * Up to {@link EventLoopShare.perTurn} calls pass in one macrotask turn; the
 * next ones wait for a `setImmediate` (`setTimeout(0)` where there is none),
 * which lets timers and I/O run first,
 * and are then let through `perTurn` at a time, in arrival order. One share
 * serves every in-process engine of the process (they share its one thread).
 */
export class EventLoopShare {
  /** Calls let through per macrotask turn. */
  readonly perTurn: number;
  private left: number;
  private readonly waiting: (() => void)[] = [];
  private armed = false;
  /** Macrotask turns taken so far (for tests and benchmarks). */
  turns = 0;

  constructor(perTurn = 16) {
    if (!Number.isInteger(perTurn) || perTurn < 1) throw new RangeError(`perTurn must be an integer >= 1, got ${perTurn}`);
    this.perTurn = perTurn;
    this.left = perTurn;
  }

  /** Resolves at once while this turn has room, else after the event loop has run other work. */
  pass(): Promise<void> | undefined {
    this.arm();
    if (this.left > 0 && this.waiting.length === 0) {
      this.left--;
      return undefined;
    }
    return new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  private arm(): void {
    if (this.armed) return;
    this.armed = true;
    later(() => {
      this.armed = false;
      this.turns++;
      this.left = this.perTurn;
      for (const go of this.waiting.splice(0, this.perTurn)) {
        this.left--;
        go();
      }
      if (this.waiting.length > 0) this.arm();
    });
  }
}

/** The next macrotask: `setImmediate` (Bun, Node: no timer clamp) or `setTimeout(0)`. */
const later: (fn: () => void) => void =
  typeof (globalThis as { setImmediate?: unknown }).setImmediate === "function" ? (fn) => void setImmediate(fn) : (fn) => void setTimeout(fn, 0);

/** The share of every {@link SimEngineClient} that is not given its own. */
export const SIM_EVENT_LOOP_SHARE = new EventLoopShare();

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

  private readonly share: EventLoopShare;

  /** `share`: how the calls yield to the event loop (default: the process-wide {@link SIM_EVENT_LOOP_SHARE}). */
  constructor(engine: SimEngine, share: EventLoopShare = SIM_EVENT_LOOP_SHARE) {
    this.engine = engine;
    this.label = `sim:${engine.name}`;
    this.share = share;
  }

  /**
   * One generation call on the engine, after its turn on the event loop
   * ({@link EventLoopShare}). With `req.on_tokens` the engine's chunks go
   * to it as they are decoded (at the engine's decode pace; log-probs null
   * unless `sampling_params.logprobs`), never after the call settles; a
   * caller that gives up (`req.signal`) after ≥ 1 chunk gets those tokens
   * back as `finish_reason: "abort"` (the `GenerateRequest.on_tokens` contract).
   */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const wait = this.share.pass();
    if (wait) await wait;
    if (req.image_data && req.image_data.length > 0) {
      // As strict as the HTTP /generate: SGLang's 400 becomes the adapter's BadEngineResponseError.
      const problem = await sglangImageProblem(this.engine.tokenizer, Array.from(req.prompt_ids), true, req.image_data);
      if (problem) throw new BadEngineResponseError(`engine at ${this.label} answered HTTP 400: ${problem}`);
    }
    let out;
    let settled = false;
    const sink = req.on_tokens;
    const want = req.sampling_params.logprobs;
    const onTokens = sink
      ? (ids: number[], lps: number[]) => {
          if (!settled && ids.length > 0) sink(ids, want ? lps : null);
        }
      : undefined;
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
        ...(onTokens ? { on_tokens: onTokens } : {}),
      });
    } catch (e) {
      settled = true;
      if (!(e instanceof SimEngineFault)) throw e;
      const what = `engine at ${this.label} failed: ${messageOf(vllmFault(e).body) ?? e.message}`;
      if (e.kind === "context_overflow") throw new ContextOverflowError(what, { status: 400, cause: e });
      if (e.kind === "client_gone") throw new EngineAbortedError(what, { cause: e });
      throw new EngineUnavailableError(what, { cause: e });
    }
    settled = true;
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

