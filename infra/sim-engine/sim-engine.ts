import { ConfigError, formatPath } from "../../shared/errors.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { fnv1a32, hashInt, unitFloat } from "../../shared/inference/hash.ts";
import { assistantOpeners, familyText } from "./family-text.ts";
import { DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BLOCKS, PrefixKvCache } from "./kv-cache.ts";
import { FaultRateInjector } from "./fault-rate.ts";
import { DEFAULT_POLICY, parseSimScript, SimFault, type SimFaultRateInput, type SimLengths, type SimRule, type SimScript, type SimTurn } from "./script.ts";

/** Default context size of the simulated model, in tokens (Qwen3-8B's native 40,960). */
export const DEFAULT_MAX_MODEL_LEN = 40_960;
/** Model name the simulated engine reports. */
export const DEFAULT_SIM_MODEL = "edgeloop/sim-qwen3";

/**
 * MoE dimensions of the simulated model, for routed experts (R3): `layers`
 * MoE layers, `top_k` experts per token and layer, out of `num_experts`.
 */
export interface SimMoe {
  layers: number;
  top_k: number;
  num_experts: number;
}

/** The simulated model's MoE shape unless `engine.moe` says otherwise: 4 layers, top-2 of 16 experts. */
export const DEFAULT_SIM_MOE: SimMoe = { layers: 4, top_k: 2, num_experts: 16 };

/** Latency model; both default to 0 (answers as fast as the tokenizer allows). */
export interface SimLatency {
  /** Milliseconds per prompt token not found in the prefix cache. */
  prefill_ms_per_token?: number;
  /** Milliseconds per generated token. */
  decode_ms_per_token?: number;
}

/** Options of {@link SimEngine}. */
export interface SimEngineOptions {
  /** The real tokenizer (Qwen3's from `defaultTokenizer()` unless another model is simulated). */
  tokenizer: ChatTokenizer;
  /** Scripted policy (parsed or raw JSON value); default {@link DEFAULT_POLICY}. */
  script?: SimScript | unknown;
  /** Replica name, for logs (`replica-0`, a URL...). */
  name?: string;
  model?: string;
  /** Context size in tokens (default {@link DEFAULT_MAX_MODEL_LEN}); prompt + max_tokens beyond it is a 400. */
  maxModelLen?: number;
  /** Prefix-cache capacity in blocks (default {@link DEFAULT_KV_CACHE_BLOCKS}). */
  kvCacheBlocks?: number;
  /** Tokens per cache block (default 16). */
  blockSize?: number;
  latency?: SimLatency;
  /** Replica-level fault, checked before the script's. */
  fault?: SimFault;
  /**
   * Probabilistic faults, drawn when no other fault fires: a spec, or an
   * injector shared with other replicas (see `startSimEngine`). Overrides the
   * script's `fault_rate`.
   */
  faultRate?: SimFaultRateInput | FaultRateInjector;
  /** MoE shape for routed experts (default {@link DEFAULT_SIM_MOE}); `num_experts` defaults to `max(16, top_k)`. */
  moe?: { layers: number; top_k: number; num_experts?: number };
  /**
   * Seed of the prompt log-probs this engine scores with (vLLM
   * `prompt_logprobs`, SGLang `input_token_logprobs`; see `simPromptLogProbs`):
   * a simulated teacher is an engine with its own `scoreSeed` (default 0).
   */
  scoreSeed?: number;
}

/** One generation request as the core sees it (after an HTTP layer has parsed its wire format). */
export interface SimGenerateRequest {
  request_id: string;
  prompt_ids: readonly number[];
  /** Generated tokens at most (≥ 1). */
  max_tokens: number;
  stop_token_ids?: readonly number[];
  /**
   * Stop strings: the turn ends at the first generated token whose decoded
   * text (special tokens kept) completes one of them; that token is kept.
   */
  stop?: readonly string[];
  /** The routing key the call carried (`X-Session-ID`), for the request log. */
  routing_key?: string;
  /** Which endpoint served it (`/v1/completions`, `/generate`, `in-process`...). */
  endpoint?: string;
  /** Client gone / deadline: ends a `hang`. */
  signal?: AbortSignal;
  /**
   * How the context limit is compared: `vllm` (default) refuses `prompt +
   * max_tokens > max_model_len` (equality is served); `sglang` refuses
   * `prompt >= context_len` and `prompt + max_new_tokens >= context_len`.
   * @see docs/engines.md §2.7 (vLLM `TokenizeParams._token_len_check`) and §3.3 (SGLang `TokenizerManager._validate_one_request`)
   */
  context_rule?: "vllm" | "sglang";
}

/**
 * What the core generated. `stop_token` is the id that ended a `stop` turn, if
 * one did; `stop_string` the requested stop string that ended it, if one did
 * (then `stop_token` is null).
 */
export interface SimGenerateResult {
  token_ids: number[];
  /** One per token, in [−5, 0], deterministic in (seed, prompt, position). */
  log_probs: number[];
  finish_reason: "stop" | "length" | "abort";
  stop_token: number | null;
  stop_string: string | null;
  /** Whether `stop_token` was among the request's `stop_token_ids` (vLLM's `stop_reason` then names it). */
  stop_token_requested: boolean;
  prompt_tokens: number;
  /** Prompt tokens served from this replica's prefix cache. */
  cached_tokens: number;
  /** Which assistant turn of the script this was (0-based). */
  turn_index: number;
  /** Index of the rule that applied, −1 for `default`. */
  rule_index: number;
  /** The replica's weight version when the reply was ready (SGLang's `meta_info.weight_version`). */
  weight_version: string;
  /** Times a `retract` pause took this request's KV away (SGLang `meta_info.num_retractions`). */
  num_retractions: number;
}

/**
 * A failure the engine answers instead of tokens. The HTTP layer renders it
 * in each engine's wire format; {@link SimEngineClient} turns it into the typed error.
 * `kind`: `http_500`, `http_503`, `context_overflow`, `client_gone` (a hang ended by the client).
 */
export class SimEngineFault extends Error {
  override name = "SimEngineFault";
  constructor(
    readonly kind: "http_500" | "http_503" | "context_overflow" | "client_gone",
    message: string,
    readonly detail: { prompt_tokens?: number; max_tokens?: number; max_model_len?: number } = {},
  ) {
    super(message);
  }
}

/** One line of a replica's request log (last 10,000 kept). */
export interface SimRequestLog {
  request_id: string;
  routing_key?: string;
  endpoint?: string;
  prompt_tokens: number;
  /** The request's `stop_token_ids`, when it carried any. */
  stop_token_ids?: number[];
  /** The request's stop strings, when it carried any. */
  stop?: string[];
  cached_tokens?: number;
  completion_tokens?: number;
  finish_reason?: string;
  fault?: string;
  /** Epoch ms the request arrived (before any hold by a pause). */
  received_ms?: number;
  /** Arrival order on this replica (1, 2, …): orders requests and pauses within one millisecond (see `SimPauseRecord.after_seq`). */
  seq?: number;
  /** Epoch ms generation started (after a hold by a pause; = `received_ms` when none). */
  started_ms?: number;
  /** Epoch ms the reply was ready. */
  ended_ms?: number;
  /** The replica's `weight_version` when the request ended. */
  weight_version?: string;
}

/**
 * How a pause treats in-flight requests (both engines' modes):
 * `abort` — they end now with the tokens generated so far (`finish_reason`
 * abort); `wait` — they run to completion, then the replica is paused;
 * `keep` (vLLM) / `in_place` (SGLang) — they are frozen and continue after
 * resume; `retract` (SGLang) — they go back to the waiting queue, their KV
 * dropped, and are recomputed (prefill of prompt + generated tokens) on
 * resume. In every mode new requests are held (not refused) until resume.
 * @see https://docs.vllm.ai/en/latest/training/async_rl/ (abort/wait/keep), SGLang `PauseGenerationReqInput` (abort/in_place/retract)
 */
export type SimPauseMode = "abort" | "wait" | "keep" | "in_place" | "retract";

/** One pause of a replica: its mode and when it began and ended (epoch ms; `resumed_ms` null while paused). */
export interface SimPauseRecord {
  mode: SimPauseMode;
  clear_cache: boolean;
  paused_ms: number;
  resumed_ms: number | null;
  /** `seq` of the last request that arrived before the pause began: later ones arrived during it (or after it). */
  after_seq: number;
}

/** Counters of one replica. */
export interface SimEngineStats {
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  inflight: number;
  max_inflight: number;
}

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
  private readonly header: number[];
  private readonly newline: number[];
  private readonly imStart?: number;
  private readonly openers: { openers: number[][]; tail: number[] };
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

  constructor(opts: SimEngineOptions) {
    this.tokenizer = opts.tokenizer;
    this.name = opts.name ?? "sim";
    this.model = opts.model ?? DEFAULT_SIM_MODEL;
    this.maxModelLen = opts.maxModelLen ?? DEFAULT_MAX_MODEL_LEN;
    this.scoreSeed = opts.scoreSeed ?? 0;
    this.cache = new PrefixKvCache({ capacityBlocks: opts.kvCacheBlocks ?? DEFAULT_KV_CACHE_BLOCKS, blockSize: opts.blockSize ?? DEFAULT_BLOCK_SIZE });
    this.latency = { prefill_ms_per_token: opts.latency?.prefill_ms_per_token ?? 0, decode_ms_per_token: opts.latency?.decode_ms_per_token ?? 0 };
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
    this.imStart = this.tokenizer.tokenId("<|im_start|>");
    this.header = this.imStart === undefined ? [] : this.tokenizer.encode("<|im_start|>assistant");
    this.newline = this.tokenizer.encode("\n");
    // Other families (no <|im_start|>): their generation prompt opens an assistant turn.
    this.openers = this.imStart === undefined ? assistantOpeners(this.tokenizer) : { openers: [], tail: [] };
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
   * Number of assistant turns already in the prompt: occurrences of
   * `<|im_start|>assistant`, not counting the last one while it is still open
   * (no `<|im_end|>` or `<|im_start|>` after it: the generation prompt, or a
   * turn being resumed after an abort). Also returns the open turn's tokens
   * after `assistant\n` (what was generated of it so far).
   */
  assistantTurns(ids: readonly number[]): { count: number; open: number[] | undefined } {
    if (this.imStart === undefined) return this.familyAssistantTurns(ids);
    const h = this.header;
    if (h.length === 0) return { count: 0, open: undefined };
    let count = 0;
    let last = -1;
    for (let i = 0; i + h.length <= ids.length; i++) {
      let ok = true;
      for (let j = 0; j < h.length; j++) if (ids[i + j] !== h[j]) { ok = false; break; }
      if (ok) {
        count++;
        last = i;
      }
    }
    if (last < 0) return { count: 0, open: undefined };
    let start = last + h.length;
    for (let i = start; i < ids.length; i++) {
      if (this.tokenizer.isStopToken(ids[i]) || ids[i] === this.imStart) return { count, open: undefined };
    }
    if (this.newline.length === 1 && ids[start] === this.newline[0]) start++;
    return { count: count - 1, open: ids.slice(start) as number[] };
  }

  /**
   * {@link assistantTurns} for families without `<|im_start|>`: occurrences
   * of any opener (see `assistantOpeners`), the last one open when no stop,
   * turn-end id or opener follows it.
   */
  private familyAssistantTurns(ids: readonly number[]): { count: number; open: number[] | undefined } {
    let count = 0;
    let last = -1;
    let lastLen = 0;
    const firsts = new Set(this.openers.openers.map((o) => o[0]));
    for (let i = 0; i < ids.length; i++) {
      for (const o of this.openers.openers) {
        if (o.length > 0 && i + o.length <= ids.length && o.every((t, j) => ids[i + j] === t) && !this.continuesAssistant(ids, i, o)) {
          count++;
          last = i;
          lastLen = o.length;
          break;
        }
      }
    }
    if (last < 0) return { count: 0, open: undefined };
    let start = last + lastLen;
    for (let i = start; i < ids.length; i++) {
      if (this.tokenizer.isStopToken(ids[i]) || this.tokenizer.turnEndIds.includes(ids[i]!) || firsts.has(ids[i])) return { count, open: undefined };
    }
    const tail = this.openers.tail;
    if (tail.length > 0 && tail.every((t, j) => ids[start + j] === t)) start += tail.length;
    return { count: count - 1, open: ids.slice(start) as number[] };
  }

  /**
   * Harmony writes one `<|start|>assistant` per message, and one assistant
   * turn holds several (analysis, then a call or the final answer): an
   * opener whose previous message is also the assistant's continues the
   * same turn.
   */
  private continuesAssistant(ids: readonly number[], i: number, opener: readonly number[]): boolean {
    if (this.tokenizer.traits.family !== "gpt_oss") return false;
    const start = opener[0];
    for (let j = i - 1; j >= 0; j--) if (ids[j] === start) return opener.every((t, k) => ids[j + k] === t);
    return false;
  }

  /** The rule index that applies to a prompt (−1: none) and the turn to play. */
  resolve(ids: readonly number[], routingKey?: string): { rule_index: number; turn_index: number; turn: SimTurn; open: number[] | undefined; scripted: boolean; variant: number } {
    const { count, open } = this.assistantTurns(ids);
    let ruleIndex = -1;
    let rule: SimRule | undefined;
    if (this.script.rules.length > 0) {
      const text = ids.length === 0 ? "" : this.tokenizer.decode(ids);
      ruleIndex = this.script.rules.findIndex((r) => text.includes(r.when));
      rule = ruleIndex >= 0 ? this.script.rules[ruleIndex] : undefined;
    }
    const variant = rule ? this.variantOf(rule, ruleIndex, routingKey) : 0;
    const turns = rule ? (variant === 0 ? rule.turns : rule.variants![variant - 1]!) : [];
    let turn: SimTurn;
    let scripted = false;
    if (rule && count < turns.length) {
      turn = turns[count];
      scripted = true;
    }
    else {
      const d = this.script.default;
      turn = d[Math.min(count - turns.length, d.length - 1)];
    }
    return { rule_index: ruleIndex, turn_index: count, turn, open, scripted, variant };
  }

  /**
   * Which turn list of `rule` a trajectory plays (see `SimRule.variants`): 0
   * for `turns`, k for `variants[k − 1]`, drawn from (seed, rule index, the
   * session index in the routing key `{uid}_{session_id}_{output}`).
   */
  private variantOf(rule: SimRule, ruleIndex: number, routingKey: string | undefined): number {
    const n = rule.variants?.length ?? 0;
    if (n === 0 || routingKey === undefined) return 0;
    const m = /_(\d+)_\d+$/.exec(routingKey);
    if (!m) return 0;
    return fnv1a32(`${this.script.seed}:variant:${ruleIndex}:${m[1]}`) % (n + 1);
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
    if (this.script.lengths && !r.scripted) ({ ids, finish } = this.stretch(ids, this.script.lengths, req.routing_key ?? String(fnv1a32(prompt.join(","))), r.turn_index));
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
    for (let i = 0; i < ids.length; i++) {
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
        this.frozen++;
        this.checkIdle();
        if (p.mode === "retract") retractions++;
        const ok = await this.holdWhilePaused(req.signal, epoch);
        this.frozen--;
        if (ok === false) throw gone();
        if (ok === "aborted") {
          i--;
          continue;
        }
        if (p.mode === "retract" && this.latency.prefill_ms_per_token > 0 && !(await sleep((P + i) * this.latency.prefill_ms_per_token, req.signal))) throw gone();
        paceFrom = performance.now();
        paced = i;
        i--;
        continue;
      }
      if (decodeMs > 0) {
        const ahead = paceFrom + (i + 1 - paced) * decodeMs - performance.now();
        if (ahead >= 1 || i === ids.length - 1) {
          if (!(await sleep(ahead, req.signal))) throw gone();
        }
      }
    }
    const logProbs = this.logProbs(prompt, ids.length);
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

  /**
   * The first token whose decoded prefix `ids[0..index]` contains a stop
   * string, and that string (the first of `stops`, in request order, found
   * there, as vLLM's `check_stop_strings` iterates); undefined when the text
   * never contains one. Special tokens are kept in the text, as with the
   * `skip_special_tokens: false` edgeloop sends.
   *
   * Found by a galloping then binary search over prefixes (a prefix's text
   * only grows as tokens are added, so "holds a stop string" flips once):
   * about 2·log2(index) decodes of at most `index + 1` tokens, where decoding
   * every prefix in turn was quadratic in the reply's length.
   * @see vLLM `StopChecker.check_stop_strings` and v1 `IncrementalDetokenizer.update` (text truncated, token ids kept)
   */
  stopStringAt(ids: readonly number[], stops: readonly string[]): { index: number; stop: string } | undefined {
    const found = (text: string) => stops.find((s) => s.length > 0 && text.includes(s));
    const n = ids.length;
    if (n === 0 || !found(this.tokenizer.decode(ids))) return undefined;
    const at = (k: number) => found(this.tokenizer.decode(ids.slice(0, k + 1)));
    // Invariant: no stop in prefix `lo` (−1: the empty prefix), one in prefix `hi` (n − 1: checked above).
    let lo = -1;
    let hi = n - 1;
    for (let step = 1, k = 0; k < hi; k = lo + step, step *= 2) {
      if (at(k) !== undefined) {
        hi = k;
        break;
      }
      lo = k;
    }
    while (hi - lo > 1) {
      const mid = lo + ((hi - lo) >> 1);
      if (at(mid) !== undefined) hi = mid;
      else lo = mid;
    }
    return { index: hi, stop: at(hi)! };
  }

  /** A scripted turn's ids and nominal finish reason. */
  turnTokens(turn: SimTurn, stopIds: readonly number[] = []): { ids: number[]; finish: "stop" | "length" | "abort" } {
    const eos = this.tokenizer.eosTokenId;
    // A family text that already ends with a stop id (harmony's <|call|>/<|return|>) gets no eos after it.
    const closed = (ids: number[]) => (this.tokenizer.isStopToken(ids.at(-1)) ? ids : [...ids, eos]);
    if (typeof turn === "string") return { ids: closed(this.tokenizer.encode(familyText(this.tokenizer, turn))), finish: "stop" };
    if ("text" in turn) {
      const finish = turn.finish_reason ?? "stop";
      const ids = this.tokenizer.encode(familyText(this.tokenizer, turn.text));
      return { ids: finish === "stop" ? closed(ids) : ids, finish };
    }
    const last = turn.token_ids[turn.token_ids.length - 1];
    const ends = last !== undefined && (this.tokenizer.isStopToken(last) || stopIds.includes(last));
    return { ids: [...turn.token_ids], finish: turn.finish_reason ?? (ends ? "stop" : "length") };
  }

  /**
   * An unscripted turn at the length drawn for it (script `lengths`, see
   * {@link SimLengths}): its ids without the closing stop id, repeated to
   * L − 1 tokens, then the model's end id; `finish` stop.
   */
  private stretch(ids: number[], lengths: SimLengths, key: string, turnIndex: number): { ids: number[]; finish: "stop" } {
    const L = SimEngine.drawLength(lengths, this.script.seed, key, turnIndex);
    const body = ids.length > 0 && this.tokenizer.isStopToken(ids[ids.length - 1]) ? ids.slice(0, -1) : ids;
    const src = body.length > 0 ? body : this.newline;
    const out: number[] = new Array(L);
    for (let i = 0; i < L - 1; i++) out[i] = src[i % src.length]!;
    out[L - 1] = this.tokenizer.eosTokenId;
    return { ids: out, finish: "stop" };
  }

  /**
   * The length (tokens, end id included) of an unscripted turn under
   * `lengths`: lognormal by Box–Muller over two uniforms hashed from (seed,
   * key, turn index), clamped to `min..max`.
   */
  static drawLength(lengths: SimLengths, seed: number, key: string, turnIndex: number): number {
    const h = hashInt(hashInt(fnv1a32(key), seed), turnIndex);
    const u1 = unitFloat(hashInt(h, 1));
    const u2 = unitFloat(hashInt(h, 2));
    const z = Math.sqrt(-2 * Math.log(1 - u1)) * Math.cos(2 * Math.PI * u2);
    return Math.min(lengths.max, Math.max(lengths.min, Math.round(lengths.median * Math.exp(lengths.sigma * z))));
  }

  /** Deterministic log-probs in [−5, 0] for `n` tokens after `prompt` (4 decimals). */
  logProbs(prompt: readonly number[], n: number): number[] {
    let h = hashInt(0x3c6ef372, this.script.seed);
    for (let i = 0; i < prompt.length; i++) h = hashInt(h, prompt[i]);
    const out: number[] = new Array(n);
    for (let i = 0; i < n; i++) {
      const u = unitFloat(hashInt(h, prompt.length + i));
      out[i] = Math.round(-5 * u * u * 1e4) / 1e4 + 0;
    }
    return out;
  }

  /**
   * Deterministic routed experts of the first `tokens` positions of
   * `stream` (a call's input ‖ output), int32 row-major `[tokens, layers,
   * top_k]`: a pure function of (script seed, position, token id, previous
   * token id, layer) — the same stream prefix always routes the same, as a
   * prefix-cached engine reports it. Slot k of a layer is `(h + k) mod
   * num_experts` for that layer's hash h, so a token's experts in one layer
   * are distinct. SGLang's coverage is `tokens = P + C − 1` (see `sglangReply`).
   */
  routedExperts(stream: readonly number[], tokens: number): Int32Array {
    const { layers, top_k: k, num_experts: e } = this.moe;
    const n = Math.max(0, Math.min(tokens, stream.length));
    const out = new Int32Array(n * layers * k);
    const seed = hashInt(0x9e3779b9, this.script.seed);
    let o = 0;
    for (let p = 0; p < n; p++) {
      const h0 = hashInt(hashInt(hashInt(seed, p), stream[p]!), p > 0 ? stream[p - 1]! : 0xffffffff);
      for (let l = 0; l < layers; l++) {
        const base = hashInt(h0, l) % e;
        for (let j = 0; j < k; j++) out[o++] = (base + j) % e;
      }
    }
    return out;
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
