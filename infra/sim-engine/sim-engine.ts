import { ConfigError, formatPath } from "../../shared/errors.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { AssistantTurns, resolveTurn, type ResolvedTurn } from "./assistant-turns.ts";
import { DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BLOCKS, PrefixKvCache } from "./kv-cache.ts";
import { FaultRateInjector } from "./fault-rate.ts";
import { DEFAULT_POLICY, parseSimScript, SimFault, type SimLengths, type SimScript, type SimTurn } from "./script.ts";
import { drawLength, simLogProbs, simRoutedExperts, stopStringAt, stretchTurn, turnTokens } from "./scripted-tokens.ts";
import { DEFAULT_MAX_MODEL_LEN, DEFAULT_SIM_MODEL, DEFAULT_SIM_MOE, SimEngineFault, type SimEngineOptions, type SimEngineStats, type SimGenerateRequest, type SimGenerateResult, type SimLatency, type SimMoe, type SimPauseMode, type SimPauseRecord, type SimRequestLog } from "./sim-types.ts";

// The engine's shapes and defaults live in sim-types.ts, turn resolution in assistant-turns.ts and the
// token functions in scripted-tokens.ts; this file keeps the engine's state: queueing, pauses, faults, cache.
export { DEFAULT_MAX_MODEL_LEN, DEFAULT_SIM_MODEL, DEFAULT_SIM_MOE, SimEngineFault } from "./sim-types.ts";
export type { SimEngineOptions, SimEngineStats, SimGenerateRequest, SimGenerateResult, SimLatency, SimMoe, SimPauseMode, SimPauseRecord, SimRequestLog } from "./sim-types.ts";

const LOG_LIMIT = 10_000;

/**
 * The simulated engine of one replica, runtime-free (Web APIs and `shared/`
 * only): scripted generation on the real tokenizer, a prefix KV cache, a
 * latency model and fault injection. HTTP wire formats live in `app.ts`.
 */
export class SimEngine {
  readonly tokenizer: ChatTokenizer;
  readonly name: string;
  readonly model: string;
  readonly maxModelLen: number;
  readonly cache: PrefixKvCache;
  readonly latency: Required<SimLatency>;
  /** The simulated model's MoE shape (routed experts). */
  readonly moe: SimMoe;
  /** `/health` answers 503 when false. */
  healthy = true;
  /** Recent requests, oldest first. */
  readonly requests: SimRequestLog[] = [];
  readonly stats: SimEngineStats = { requests: 0, prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0, inflight: 0, max_inflight: 0 };
  private script: SimScript;
  private fault?: { spec: SimFault; left: number };
  private readonly ruleFaultsLeft = new Map<number, number>();
  private scriptFaultLeft = Infinity;
  private readonly turns: AssistantTurns;
  private readonly ownFaultRate: boolean;
  /** The probabilistic-fault injector (its `injected` log and `counts`), when a fault rate is set. */
  faultRate: FaultRateInjector | undefined;
  /**
   * The weights' version, reported in SGLang replies' `meta_info.weight_version`
   * (SGLang's default `--weight-version` is `"default"`). Set by
   * `POST /update_weight_version {"new_version"}` or directly.
   */
  weightVersion = "default";
  /** Seed of this engine's prompt log-probs (see {@link SimEngineOptions.scoreSeed}). */
  readonly scoreSeed: number;
  /** Every pause of this replica, oldest first. */
  readonly pauses: SimPauseRecord[] = [];
  private pauseState: { mode: SimPauseMode; resumed: Promise<void>; resume: () => void } | null = null;
  /** Requests past the pause hold, not yet answered. */
  private active = 0;
  /** Of those, how many are frozen by a pause. */
  private frozen = 0;
  private idleWaiters: (() => void)[] = [];
  private drainWaiters: (() => void)[] = [];
  /** Bumped by {@link abortAll}; a request that saw another value ends `abort`. */
  private abortEpoch = 0;
  private abortWake: { promise: Promise<void>; wake: () => void } = wakeable();
  /**
   * Set when the simulated scheduler died (a weight update whose cache flush
   * failed: SGLang asserts then); every later request fails and `/health` is 503.
   */
  dead: string | null = null;
  /**
   * A test's hold on chosen requests: called as each request arrives (after any
   * pause hold); when it returns a promise, the request waits for it (or for its
   * client to give up) before generating. Tests use it to order sessions by
   * events instead of by the clock. Unset (the default): nothing is held.
   */
  gate: ((req: SimGenerateRequest) => Promise<void> | undefined) | undefined;

  constructor(opts: SimEngineOptions) {
    this.tokenizer = opts.tokenizer;
    this.name = opts.name ?? "sim";
    this.model = opts.model ?? DEFAULT_SIM_MODEL;
    this.maxModelLen = opts.maxModelLen ?? DEFAULT_MAX_MODEL_LEN;
    this.scoreSeed = opts.scoreSeed ?? 0;
    this.cache = new PrefixKvCache({ capacityBlocks: opts.kvCacheBlocks ?? DEFAULT_KV_CACHE_BLOCKS, blockSize: opts.blockSize ?? DEFAULT_BLOCK_SIZE });
    this.latency = { prefill_ms_per_token: opts.latency?.prefill_ms_per_token ?? 0, decode_ms_per_token: opts.latency?.decode_ms_per_token ?? 0, stream_every_token: opts.latency?.stream_every_token ?? false };
    const moe = opts.moe ?? DEFAULT_SIM_MOE;
    this.moe = { layers: moe.layers, top_k: moe.top_k, num_experts: moe.num_experts ?? Math.max(DEFAULT_SIM_MOE.num_experts, moe.top_k) };
    if (!(this.moe.layers >= 1 && this.moe.top_k >= 1 && this.moe.num_experts >= this.moe.top_k)) {
      throw new ConfigError("engine.moe", `needs layers >= 1, top_k >= 1 and num_experts >= top_k, got ${JSON.stringify(this.moe)}`);
    }
    this.script = DEFAULT_POLICY;
    this.ownFaultRate = opts.faultRate !== undefined;
    this.setScript(opts.script ?? DEFAULT_POLICY);
    if (opts.faultRate) this.faultRate = opts.faultRate instanceof FaultRateInjector ? opts.faultRate : new FaultRateInjector(opts.faultRate, this.script.seed);
    if (opts.fault) this.setFault(opts.fault);
    this.turns = new AssistantTurns(this.tokenizer);
  }

  /** Whether the replica is paused (vLLM `GET /is_paused`). */
  get paused(): boolean {
    return this.pauseState !== null;
  }

  /** Requests not yet answered: held by a pause, frozen, or generating (SGLang's waiting queue plus running batch). */
  get pending(): number {
    return this.stats.inflight;
  }

  /**
   * Ends every request not yet answered with `finish_reason: abort` (the
   * tokens generated so far kept): generating ones at their next token,
   * frozen and held ones at once. SGLang `abort_all_requests`.
   */
  abortAll(): void {
    this.abortEpoch++;
    const w = this.abortWake;
    this.abortWake = wakeable();
    w.wake();
  }

  /** Resolves once no request is pending ({@link pending} 0). */
  whenNoPending(): Promise<void> {
    if (this.stats.inflight === 0) return Promise.resolve();
    return new Promise((r) => this.drainWaiters.push(r));
  }

  /**
   * The simulated scheduler dies (`reason` is what it died of): SGLang's
   * `flush_cache_after_weight_update` asserts that the flush worked, and the
   * server goes down with it.
   */
  kill(reason: string): void {
    this.dead = reason;
    this.healthy = false;
    this.abortAll();
  }

  /** Requests past the pause hold, not yet answered (generating or frozen): the running batch. */
  get running(): number {
    return this.active;
  }

  /** Requests generating now: past the pause hold and not frozen by a pause (0 = the replica is idle). */
  get generating(): number {
    return this.active - this.frozen;
  }

  /** The current pause's mode, or null. */
  get pauseMode(): SimPauseMode | null {
    return this.pauseState?.mode ?? null;
  }

  /**
   * Pauses generation (see {@link SimPauseMode}). Resolves once the pause
   * holds, i.e. no request is generating any more: aborted ones have
   * answered (`abort`), every in-flight one finished (`wait`), or each is
   * frozen at its next token or finished (`keep`, `in_place`, `retract`). New requests
   * are held until {@link resume}. `clearCache` empties the prefix cache.
   * Pausing a paused replica changes the mode of the pause for requests not yet frozen.
   */
  async pause(mode: SimPauseMode, clearCache = false): Promise<void> {
    if (this.pauseState) this.pauseState.mode = mode;
    else {
      let resume!: () => void;
      const resumed = new Promise<void>((r) => (resume = r));
      this.pauseState = { mode, resumed, resume };
      this.pauses.push({ mode, clear_cache: clearCache, paused_ms: Date.now(), resumed_ms: null, after_seq: this.stats.requests });
    }
    await this.whenIdle();
    if (clearCache) this.cache.clear();
  }

  /** Ends a pause: frozen requests continue, held ones start. No-op when not paused. */
  resume(): void {
    const p = this.pauseState;
    if (!p) return;
    this.pauseState = null;
    const last = this.pauses.at(-1);
    if (last) last.resumed_ms = Date.now();
    p.resume();
  }

  private whenIdle(): Promise<void> {
    if (this.active === this.frozen) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }

  private checkIdle(): void {
    if (this.active === this.frozen) for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Waits while paused (held or frozen); false when the client gave up meanwhile, "aborted" when {@link abortAll} ended it. */
  private async holdWhilePaused(signal?: AbortSignal, epoch = this.abortEpoch): Promise<boolean | "aborted"> {
    while (this.pauseState) {
      if (epoch !== this.abortEpoch) return "aborted";
      const p = this.pauseState;
      const gone = signal ? new Promise<false>((r) => (signal.aborted ? r(false) : signal.addEventListener("abort", () => r(false), { once: true }))) : undefined;
      const woke = this.abortWake.promise.then(() => "aborted" as const);
      const ok = await Promise.race([p.resumed.then(() => true), woke, ...(gone ? [gone] : [])]);
      if (ok !== true) return ok;
    }
    return epoch !== this.abortEpoch ? "aborted" : true;
  }

  /** Replaces the scripted policy (validated; fault counters restart). @throws ConfigError */
  setScript(script: SimScript | unknown): void {
    this.script = parseSimScript(script);
    this.ruleFaultsLeft.clear();
    this.script.rules.forEach((r, i) => r.fault && this.ruleFaultsLeft.set(i, r.fault.times ?? Infinity));
    this.scriptFaultLeft = this.script.fault?.times ?? Infinity;
    if (!this.ownFaultRate) this.faultRate = this.script.fault_rate ? new FaultRateInjector(this.script.fault_rate, this.script.seed) : undefined;
  }

  /** The current script. */
  get policy(): SimScript {
    return this.script;
  }

  /** Sets (or clears, with null) this replica's fault. @throws ConfigError on a bad shape */
  setFault(fault: SimFault | null): void {
    if (fault === null) {
      this.fault = undefined;
      return;
    }
    const r = SimFault.safeParse(fault);
    if (!r.success) {
      const first = r.error.issues[0];
      throw new ConfigError(formatPath("fault", first?.path ?? []), first?.message ?? "invalid fault", { cause: r.error });
    }
    this.fault = { spec: r.data, left: r.data.times ?? Infinity };
  }

  /**
   * Number of assistant turns already in the prompt, not counting the last
   * one while it is still open, and the open turn's tokens so far (see
   * {@link AssistantTurns.count}).
   */
  assistantTurns(ids: readonly number[]): { count: number; open: number[] | undefined } {
    return this.turns.count(ids);
  }

  /** The rule index that applies to a prompt (−1: none) and the turn to play ({@link resolveTurn} on the current script). */
  resolve(ids: readonly number[], routingKey?: string): ResolvedTurn {
    return resolveTurn(this.script, this.tokenizer, this.turns, ids, routingKey);
  }

  /**
   * Generates one reply. Order: context check, fault, prefix-cache lookup,
   * prefill latency, scripted tokens (resuming an open turn whose partial
   * tokens prefix the script's), stop ids and stop strings, `max_tokens`, log-probs, decode
   * latency, cache insert of prompt ‖ output.
   * @throws SimEngineFault for 5xx/overflow faults, natural context overflow, and a hang ended by the client
   */
  async generate(req: SimGenerateRequest): Promise<SimGenerateResult> {
    const log: SimRequestLog = { request_id: req.request_id, routing_key: req.routing_key, endpoint: req.endpoint, prompt_tokens: req.prompt_ids.length, received_ms: Date.now() };
    if (req.stop_token_ids?.length) log.stop_token_ids = [...req.stop_token_ids];
    if (req.stop?.length) log.stop = [...req.stop];
    this.requests.push(log);
    if (this.requests.length > LOG_LIMIT) this.requests.splice(0, this.requests.length - LOG_LIMIT);
    this.stats.requests++;
    log.seq = this.stats.requests;
    this.stats.inflight++;
    this.stats.max_inflight = Math.max(this.stats.max_inflight, this.stats.inflight);
    let counted = false;
    const epoch = this.abortEpoch;
    try {
      if (this.dead) throw new SimEngineFault("http_500", `the scheduler of ${this.name} died: ${this.dead}`);
      // New requests are held (not refused) while the replica is paused.
      const held = await this.holdWhilePaused(req.signal, epoch);
      if (held === false) throw new SimEngineFault("client_gone", `client gave up on ${req.request_id}`);
      const gated = this.gate?.(req);
      if (gated && !(await untilOrGone(gated, req.signal))) throw new SimEngineFault("client_gone", `client gave up on ${req.request_id}`);
      log.started_ms = Date.now();
      this.active++;
      counted = true;
      const out = held === "aborted" ? this.abortedResult(req) : await this.run(req, log, epoch);
      // A scheduler that died under a request takes its connection with it: no reply, a 5xx.
      if (this.dead) throw new SimEngineFault("http_500", `the scheduler of ${this.name} died: ${this.dead}`);
      log.ended_ms = Date.now();
      log.weight_version = this.weightVersion;
      log.cached_tokens = out.cached_tokens;
      log.completion_tokens = out.token_ids.length;
      log.finish_reason = out.finish_reason;
      this.stats.prompt_tokens += out.prompt_tokens;
      this.stats.cached_tokens += out.cached_tokens;
      this.stats.completion_tokens += out.token_ids.length;
      return out;
    } catch (e) {
      log.fault = e instanceof SimEngineFault ? e.kind : String(e);
      throw e;
    } finally {
      this.stats.inflight--;
      if (this.stats.inflight === 0) for (const w of this.drainWaiters.splice(0)) w();
      if (counted) {
        this.active--;
        this.checkIdle();
      }
    }
  }

  /** What a request ended by {@link abortAll} before it generated answers: no tokens, `abort`. */
  private abortedResult(req: SimGenerateRequest): SimGenerateResult {
    return {
      token_ids: [],
      log_probs: [],
      finish_reason: "abort",
      stop_token: null,
      stop_string: null,
      stop_token_requested: false,
      prompt_tokens: req.prompt_ids.length,
      cached_tokens: 0,
      turn_index: -1,
      rule_index: -1,
      weight_version: this.weightVersion,
      num_retractions: 0,
    };
  }

  private async run(req: SimGenerateRequest, log: SimRequestLog, epoch: number): Promise<SimGenerateResult> {
    const prompt = req.prompt_ids;
    const P = prompt.length;
    const overflow = () =>
      new SimEngineFault("context_overflow", `prompt (${P}) + max_tokens (${req.max_tokens}) exceeds max_model_len (${this.maxModelLen})`, {
        prompt_tokens: P,
        max_tokens: req.max_tokens,
        max_model_len: this.maxModelLen,
      });
    if (req.context_rule === "sglang" ? P >= this.maxModelLen || P + req.max_tokens >= this.maxModelLen : P + req.max_tokens > this.maxModelLen) throw overflow();

    const r = this.resolve(prompt, req.routing_key);
    let fault = this.takeFault(r.rule_index, r.turn_index);
    let drawn: { attempt: number } | undefined;
    if (!fault && this.faultRate) {
      const d = this.faultRate.draw(req.routing_key, prompt);
      if (d.decision) {
        fault = d.decision;
        drawn = d;
        if (d.decision.kind !== "abort_after") this.faultRate.record({ kind: d.decision.kind, routing_key: req.routing_key, request_id: req.request_id, attempt: d.attempt, turn_index: r.turn_index });
      }
    }
    // A drawn abort is logged only if it cuts the turn (below).
    if (fault && !(drawn && fault.kind === "abort_after")) log.fault = fault.kind;
    if (fault?.kind === "http_500") throw new SimEngineFault("http_500", `simulated fault on ${this.name}: internal error`);
    if (fault?.kind === "http_503") throw new SimEngineFault("http_503", `simulated fault on ${this.name}: service unavailable`);
    if (fault?.kind === "context_overflow") throw overflow();
    if (fault?.kind === "hang") {
      const finished = await sleep(fault.ms, req.signal);
      if (!finished) throw new SimEngineFault("client_gone", `client gave up on ${req.request_id}`);
    }

    const cached = this.cache.lookup(prompt);
    const gone = () => new SimEngineFault("client_gone", `client gave up on ${req.request_id}`);
    if (this.latency.prefill_ms_per_token > 0 && !(await sleep((P - cached) * this.latency.prefill_ms_per_token, req.signal))) throw gone();

    const stopIds = req.stop_token_ids ?? [];
    let { ids, finish } = this.turnTokens(r.turn, stopIds);
    if (this.script.lengths && !r.scripted) ({ ids, finish } = stretchTurn(this.tokenizer, this.turns.newline, this.script.seed, ids, this.script.lengths, req.routing_key ?? String(fnv1a32(prompt.join(","))), r.turn_index));
    if (r.open && r.open.length > 0 && r.open.length <= ids.length && r.open.every((v, i) => v === ids[i])) {
      ids = ids.slice(r.open.length);
    }
    // Like a real engine, generation ends at the first id of the model's stop list (its generation
    // config's eos_token_id, e.g. Qwen3's 151645 and 151643) or a requested stop id, kept in the output.
    let stopToken: number | null = null;
    let stopString: string | null = null;
    const stopAt = ids.findIndex((t) => this.tokenizer.isStopToken(t) || stopIds.includes(t));
    // A stop string is matched on the text of the tokens before a stop id (vLLM does not detokenize
    // the stop token that ended a request), so a stop id at the same token wins.
    const byString = req.stop?.length ? this.stopStringAt(stopAt >= 0 ? ids.slice(0, stopAt) : ids, req.stop) : undefined;
    if (byString) {
      ids = ids.slice(0, byString.index + 1);
      finish = "stop";
      stopString = byString.stop;
    } else if (stopAt >= 0) {
      ids = ids.slice(0, stopAt + 1);
      finish = "stop";
      stopToken = ids[stopAt];
    }
    if (ids.length > req.max_tokens) {
      ids = ids.slice(0, req.max_tokens);
      finish = "length";
      stopToken = null;
      stopString = null;
    }
    if (fault?.kind === "abort_after") {
      const k = fault.tokens ?? 0;
      // When the turn ends before k tokens the engine finishes normally: the abort comes too late.
      if (k < ids.length) {
        ids = ids.slice(0, k);
        finish = "abort";
        stopToken = null;
        stopString = null;
        if (drawn) {
          log.fault = "abort_after";
          this.faultRate!.record({ kind: "abort", routing_key: req.routing_key, request_id: req.request_id, attempt: drawn.attempt, turn_index: r.turn_index, tokens: k });
        }
      }
    }
    // Decoding is token by token so that a pause lands between two tokens: `abort` cuts the
    // reply there, the freezing modes hold it until resume (`retract` then recomputes the prefill).
    // Paced by the clock, not one timer per token: a timer waits at least ~1 ms, so a fraction of a
    // millisecond per token would otherwise cost a whole one. The pace restarts after a pause hold.
    const decodeMs = this.latency.decode_ms_per_token;
    let paceFrom = performance.now();
    let paced = 0;
    let retractions = 0;
    // Streaming: log-probs are a pure function of (prompt, position), so the chunks can carry them
    // before decoding ends. Whatever was decoded goes out before each wait on the clock or a pause.
    const sink = req.on_tokens;
    const allLogProbs = sink ? this.logProbs(prompt, ids.length) : undefined;
    let sent = 0;
    const flush = (upTo: number, last: boolean) => {
      if (!sink) return;
      const n = Math.max(sent, upTo);
      if (n > sent || last) sink(ids.slice(sent, n), allLogProbs!.slice(sent, n), last);
      sent = n;
    };
    // A client gone after it was sent tokens gets them as an abort (the stream broke), not an error.
    let cutAt = -1;
    log.planned = ids.length;
    for (let i = 0; i < ids.length; i++) {
      log.decoded = i;
      if (epoch !== this.abortEpoch) {
        ids = ids.slice(0, i);
        finish = "abort";
        stopToken = null;
        stopString = null;
        break;
      }
      const p = this.pauseState;
      if (p && p.mode !== "wait") {
        if (p.mode === "abort") {
          ids = ids.slice(0, i);
          finish = "abort";
          stopToken = null;
          stopString = null;
          break;
        }
        flush(i, false);
        this.frozen++;
        this.checkIdle();
        if (p.mode === "retract") retractions++;
        const ok = await this.holdWhilePaused(req.signal, epoch);
        this.frozen--;
        if (ok === false) {
          if (sent > 0) {
            cutAt = i;
            break;
          }
          throw gone();
        }
        if (ok === "aborted") {
          i--;
          continue;
        }
        if (p.mode === "retract" && this.latency.prefill_ms_per_token > 0 && !(await sleep((P + i) * this.latency.prefill_ms_per_token, req.signal))) {
          if (sent > 0) {
            cutAt = i;
            break;
          }
          throw gone();
        }
        paceFrom = performance.now();
        paced = i;
        i--;
        continue;
      }
      // One chunk per token when asked (the tokens before this one; a pause set by the sink lands before it).
      if (this.latency.stream_every_token && i > sent) {
        flush(i, false);
        if ((this.pauseState && this.pauseState.mode !== "wait") || epoch !== this.abortEpoch) {
          i--;
          continue;
        }
      }
      if (decodeMs > 0) {
        const ahead = paceFrom + (i + 1 - paced) * decodeMs - performance.now();
        if (ahead >= 1 || i === ids.length - 1) {
          flush(i, false);
          if (!(await sleep(ahead, req.signal))) {
            if (sent > 0) {
              cutAt = i;
              break;
            }
            throw gone();
          }
        }
      }
    }
    if (cutAt >= 0) {
      ids = ids.slice(0, cutAt);
      finish = "abort";
      stopToken = null;
      stopString = null;
    }
    flush(ids.length, true);
    const logProbs = allLogProbs ? allLogProbs.slice(0, ids.length) : this.logProbs(prompt, ids.length);
    this.cache.insert(ids.length > 0 ? [...prompt, ...ids] : prompt);
    return {
      token_ids: ids,
      log_probs: logProbs,
      finish_reason: finish,
      stop_token: stopToken,
      stop_string: stopString,
      stop_token_requested: stopToken !== null && stopIds.includes(stopToken),
      prompt_tokens: P,
      cached_tokens: cached,
      turn_index: r.turn_index,
      rule_index: r.rule_index,
      weight_version: this.weightVersion,
      num_retractions: retractions,
    };
  }

  /** The first token whose decoded prefix contains one of `stops`, and that string ({@link stopStringAt} on this tokenizer). */
  stopStringAt(ids: readonly number[], stops: readonly string[]): { index: number; stop: string } | undefined {
    return stopStringAt(this.tokenizer, ids, stops);
  }

  /** A scripted turn's ids and nominal finish reason ({@link turnTokens} on this tokenizer). */
  turnTokens(turn: SimTurn, stopIds: readonly number[] = []): { ids: number[]; finish: "stop" | "length" | "abort" } {
    return turnTokens(this.tokenizer, turn, stopIds);
  }

  /** The length (tokens, end id included) of an unscripted turn under `lengths` (see {@link drawLength}). */
  static drawLength(lengths: SimLengths, seed: number, key: string, turnIndex: number): number {
    return drawLength(lengths, seed, key, turnIndex);
  }

  /** Deterministic log-probs in [−5, 0] for `n` tokens after `prompt` (4 decimals; {@link simLogProbs} with the script seed). */
  logProbs(prompt: readonly number[], n: number): number[] {
    return simLogProbs(this.script.seed, prompt, n);
  }

  /**
   * Deterministic routed experts of the first `tokens` positions of
   * `stream` (a call's input ‖ output), int32 row-major `[tokens, layers,
   * top_k]` ({@link simRoutedExperts} with this engine's MoE shape and the script seed).
   */
  routedExperts(stream: readonly number[], tokens: number): Int32Array {
    return simRoutedExperts(this.moe, this.script.seed, stream, tokens);
  }

  /** The fault that fires for this request, consuming one of its `times`. */
  private takeFault(ruleIndex: number, turnIndex: number): SimFault | undefined {
    const applies = (f: SimFault | undefined) => f !== undefined && (f.turn === undefined || f.turn === turnIndex);
    if (this.fault && this.fault.left > 0 && applies(this.fault.spec)) {
      this.fault.left--;
      return this.fault.spec;
    }
    const rf = ruleIndex >= 0 ? this.script.rules[ruleIndex].fault : undefined;
    if (rf && applies(rf) && (this.ruleFaultsLeft.get(ruleIndex) ?? 0) > 0) {
      this.ruleFaultsLeft.set(ruleIndex, this.ruleFaultsLeft.get(ruleIndex)! - 1);
      return rf;
    }
    const sf = this.script.fault;
    if (sf && applies(sf) && this.scriptFaultLeft > 0) {
      this.scriptFaultLeft--;
      return sf;
    }
    return undefined;
  }
}

/**
 * Waits `ms` (forever when undefined) unless `signal` aborts first.
 * Resolves true when the time passed, false when aborted.
 */
export function sleep(ms: number | undefined, signal?: AbortSignal): Promise<boolean> {
  if (signal?.aborted) return Promise.resolve(false);
  if (ms !== undefined && ms <= 0) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = ms === undefined ? undefined : setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = () => {
      if (timer !== undefined) clearTimeout(timer);
      resolve(false);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A promise and the function that resolves it. */
function wakeable(): { promise: Promise<void>; wake: () => void } {
  let wake!: () => void;
  const promise = new Promise<void>((r) => (wake = r));
  return { promise, wake };
}

/** Waits for `p`; false when `signal` aborts first (the client gave up). */
async function untilOrGone(p: Promise<void>, signal?: AbortSignal): Promise<boolean> {
  if (!signal) return p.then(() => true);
  if (signal.aborted) return false;
  let drop = () => {};
  const gone = new Promise<false>((r) => {
    const onAbort = () => r(false);
    drop = () => signal.removeEventListener("abort", onAbort);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  try {
    return await Promise.race([p.then(() => true as const), gone]);
  } finally {
    drop();
  }
}
