import { SimEngine, SimEngineFault, type SimGenerateRequest, type SimGenerateResult } from "./sim-engine.ts";
import { decodeText, sglangFault, sglangReply, tokenIdString, vllmCompletionReply, vllmFault, vllmGenerateLogprobs, vllmGenerateReply, type SimEngineVersion } from "./wire.ts";

/**
 * The simulated engine's streaming wire (`stream: true`), shaped as each
 * engine streams, at the engine's decode pace (chunks as `SimEngine`
 * decodes them, see `SimGenerateRequest.on_tokens`). Every stream is
 * `text/event-stream`: `data: <json>\n\n` events, then `data: [DONE]\n\n`.
 * @see docs/engines.md §7
 */

/** How one endpoint renders its stream's events. */
export interface StreamShape {
  /** The event of a run of new tokens (`before`: tokens streamed before it), or null to send none. */
  chunk(ids: number[], logProbs: number[], before: number, soFar: readonly number[]): unknown | null;
  /** The events after the result (`before`: tokens already streamed): the last tokens with the finish reason, usage. */
  final(out: SimGenerateResult, before: number): unknown[];
  /** A fault before any token: an HTTP reply (vLLM: validation runs before the stream), or the events of a 200 stream (SGLang: `stream_results` catches it inside). */
  earlyFault(f: SimEngineFault): { status: number; body: unknown } | { events: unknown[] };
  /** The event of a fault after the stream started (vLLM `create_streaming_error_response`, SGLang `{"error": {"message"}}`). */
  lateFault(f: SimEngineFault): unknown;
}

const enc = new TextEncoder();
const sse = (data: unknown) => enc.encode(`data: ${JSON.stringify(data)}\n\n`);
const DONE = enc.encode("data: [DONE]\n\n");

/**
 * Runs `req` on the engine and answers with its event stream. The status is
 * decided when the first chunk is decoded or the request settles, whichever
 * comes first: a fault before any token is `shape.earlyFault`; later ones
 * end the stream with `shape.lateFault`'s event and `[DONE]`. A client that
 * disconnects cancels the engine request (`signal`).
 */
export async function streamReply(engine: SimEngine, req: Omit<SimGenerateRequest, "on_tokens">, shape: StreamShape): Promise<Response> {
  let emit: ((b: Uint8Array) => void) | null = null;
  const early: Uint8Array[] = [];
  const soFar: number[] = [];
  let firstChunk!: () => void;
  const started = new Promise<null>((r) => (firstChunk = () => r(null)));
  const send = (b: Uint8Array) => (emit ? emit(b) : early.push(b));
  const on_tokens = (ids: number[], lps: number[], last: boolean) => {
    // The last run goes out with the result, in the final event (it carries the finish reason).
    if (last || ids.length === 0) return;
    const before = soFar.length;
    for (const t of ids) soFar.push(t);
    const ev = shape.chunk(ids, lps, before, soFar);
    if (ev !== null) send(sse(ev));
    firstChunk();
  };
  const settled = engine.generate({ ...req, on_tokens }).then(
    (out) => ({ out }),
    (e: unknown) => ({ e }),
  );
  const first = await Promise.race([started, settled]);
  if (first && "e" in first) {
    if (!(first.e instanceof SimEngineFault)) throw first.e;
    const r = shape.earlyFault(first.e);
    if ("status" in r) return Response.json(r.body, { status: r.status });
    return new Response(new Blob([...r.events.map(sse), DONE]), { headers: sseHeaders });
  }
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const b of early) controller.enqueue(b);
      emit = (b) => {
        try {
          controller.enqueue(b);
        } catch {
          // The client went away: the engine hears it through the request's signal.
        }
      };
      void settled.then((r) => {
        if ("e" in r) {
          if (r.e instanceof SimEngineFault && r.e.kind !== "client_gone") emit!(sse(shape.lateFault(r.e)));
        } else for (const ev of shape.final(r.out, soFar.length)) emit!(sse(ev));
        emit!(DONE);
        try {
          controller.close();
        } catch {
          // already cancelled
        }
      });
    },
  });
  return new Response(body, { headers: sseHeaders });
}

const sseHeaders = { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" };

/** Options of the vLLM stream shapes (the request's flags and the server's). */
export interface VllmStreamOptions {
  requestId: string;
  promptIds: readonly number[];
  logprobs: boolean;
  returnTokenIds: boolean;
  asTokenIds: boolean;
  skipSpecial: boolean;
  includeUsage: boolean;
  promptTokensDetails: boolean;
  version: SimEngineVersion;
}

/**
 * vLLM `/v1/completions` with `stream: true`
 * (`OpenAIServingCompletion.completion_stream_generator`): every event is a
 * `text_completion` chunk with the **new** tokens (`choices[0].token_ids`
 * with `return_token_ids`, `logprobs` of those tokens, `prompt_token_ids`
 * on the first event only), `finish_reason`/`stop_reason` null until the
 * last one (which may carry no tokens); `usage` in one more event with
 * `choices: []` when `stream_options.include_usage`.
 */
export function vllmCompletionStream(engine: SimEngine, o: VllmStreamOptions): StreamShape {
  const created = Math.floor(Date.now() / 1000);
  const event = (ids: number[], lps: number[], before: number, out: SimGenerateResult | null) => {
    const tokens = ids.map((id) => (o.asTokenIds ? tokenIdString(id) : engine.tokenizer.decode([id])));
    let off = 0;
    const offsets = tokens.map((t) => ((off += t.length), off - t.length));
    return {
      id: `cmpl-${o.requestId}`,
      object: "text_completion",
      created,
      model: engine.model,
      choices: [
        {
          index: 0,
          text: decodeText(engine, ids, o.skipSpecial),
          logprobs: o.logprobs ? { text_offset: offsets, token_logprobs: lps, tokens, top_logprobs: tokens.map((t, i) => ({ [t]: lps[i] })) } : null,
          finish_reason: out ? out.finish_reason : null,
          stop_reason: out && out.finish_reason === "stop" ? (out.stop_string ?? (out.stop_token_requested ? out.stop_token : null)) : null,
          prompt_token_ids: before === 0 && o.returnTokenIds ? [...o.promptIds] : null,
          token_ids: o.returnTokenIds ? ids : null,
        },
      ],
      usage: null,
    };
  };
  return {
    chunk: (ids, lps, before) => event(ids, lps, before, null),
    final(out, before) {
      const events: unknown[] = [event(out.token_ids.slice(before), out.log_probs.slice(before), before, out)];
      if (o.includeUsage) {
        const whole = vllmCompletionReply(engine, out, { ...o, promptTokensDetails: o.promptTokensDetails });
        events.push({ id: `cmpl-${o.requestId}`, object: "text_completion", created, model: engine.model, choices: [], usage: whole.usage });
      }
      return events;
    },
    earlyFault: (f) => vllmFault(f, o.version),
    lateFault: (f) => ({ error: { message: f.message, type: "InternalServerError", param: null, code: 500 } }),
  };
}

/**
 * vLLM `/inference/v1/generate` with `stream: true`
 * (`ServingTokens.serve_tokens_stream_generator`): events
 * `{request_id, choices: [{index, logprobs, finish_reason, token_ids}]}`
 * with the new tokens only; an output with no new tokens is skipped, so the
 * finish reason rides on the last tokens' event and an abort after the last
 * streamed token ends with `[DONE]` alone; `usage` in a last `choices: []`
 * event when `stream_options.include_usage`.
 */
export function vllmGenerateStream(o: VllmStreamOptions): StreamShape {
  const event = (ids: number[], lps: number[], finish: string | null) => ({
    request_id: `generate-tokens-${o.requestId}`,
    choices: [{ index: 0, logprobs: o.logprobs ? vllmGenerateLogprobs(ids, lps, o.version) : null, finish_reason: finish, token_ids: ids }],
  });
  return {
    chunk: (ids, lps) => event(ids, lps, null),
    final(out, before) {
      const events: unknown[] = [];
      const tail = out.token_ids.slice(before);
      if (tail.length > 0) events.push(event(tail, out.log_probs.slice(before), out.finish_reason));
      if (o.includeUsage) {
        const whole = vllmGenerateReply(out, { requestId: o.requestId, logprobs: false, version: o.version, promptTokensDetails: o.promptTokensDetails });
        events.push({ request_id: whole.request_id, choices: [], usage: whole.usage });
      }
      return events;
    },
    earlyFault: (f) => vllmFault(f, o.version),
    lateFault: (f) => ({ error: { message: f.message, type: "InternalServerError", param: null, code: 500 } }),
  };
}

/** Options of the SGLang stream shape. */
export interface SglangStreamOptions {
  rid: string;
  logprob: boolean;
  skipSpecial: boolean;
  noStopTrim: boolean;
  promptTokens: number;
  started: number;
  /** `--incremental-streaming-output`: events carry the new tokens only (default: everything so far). */
  incremental: boolean;
  /** Extra `meta_info` of the last event (a scoring call's `input_token_logprobs`). */
  finalMeta?: () => Record<string, unknown>;
}

/**
 * SGLang `/generate` with `stream: true` (`generate_request › stream_results`,
 * `OutputProcessor.handle_batch_output`): events `{text, output_ids,
 * meta_info}` — **cumulative** by default (`output_ids`, `text` and
 * `meta_info.output_token_logprobs` hold everything so far), the new tokens
 * only with `--incremental-streaming-output` — with
 * `meta_info.completion_tokens` the count so far either way and
 * `finish_reason` null until the last event, which is the non-streaming
 * reply (cumulative) or its tail. A fault is an `{"error": {"message"}}`
 * event in a 200 stream, before or after tokens.
 */
export function sglangStream(engine: SimEngine, o: SglangStreamOptions): StreamShape {
  const triples = (ids: readonly number[], lps: readonly number[]) => ids.map((id, i) => [lps[i], id, null]);
  const lpsSoFar: number[] = [];
  // The message SGLang's non-streaming reply would carry for the same failure.
  const errorEvent = (f: SimEngineFault) => {
    const b = sglangFault(f).body as { error?: { message?: string }; detail?: string };
    return { error: { message: b.error?.message ?? b.detail ?? f.message } };
  };
  return {
    chunk(ids, lps, before, soFar) {
      for (const v of lps) lpsSoFar.push(v);
      const out = o.incremental ? ids : [...soFar];
      const meta: Record<string, unknown> = {
        id: o.rid,
        finish_reason: null,
        prompt_tokens: o.promptTokens,
        weight_version: engine.weightVersion,
        num_retractions: 0,
        completion_tokens: soFar.length,
      };
      if (o.logprob) meta.output_token_logprobs = o.incremental ? triples(ids, lps) : triples(soFar, lpsSoFar);
      return { text: decodeText(engine, out, o.skipSpecial), output_ids: out, meta_info: meta };
    },
    final(out, before) {
      const whole = sglangReply(engine, out, {
        rid: o.rid,
        logprob: o.logprob,
        skipSpecial: o.skipSpecial,
        noStopTrim: o.noStopTrim,
        latencyS: Math.round(performance.now() - o.started) / 1000,
        weightVersion: out.weight_version,
      });
      const meta = whole.meta_info as Record<string, unknown>;
      if (o.finalMeta) Object.assign(meta, o.finalMeta());
      if (!o.incremental) return [whole];
      const tail = out.token_ids.slice(before);
      if (o.logprob) meta.output_token_logprobs = (meta.output_token_logprobs as unknown[]).slice(before);
      return [{ text: decodeText(engine, tail, o.skipSpecial), output_ids: tail, meta_info: meta }];
    },
    earlyFault: (f) => ({ events: [errorEvent(f)] }),
    lateFault: errorEvent,
  };
}
