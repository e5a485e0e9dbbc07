import { keyPart } from "../store/key-encoding.ts";
import { checkReward, DEFAULT_SESSION_LIMITS, SessionLimitError, type SessionLimits } from "../agent-loop/session-limits.ts";
import { KeyedChain } from "../session/keyed-chain.ts";
import { LRUCache } from "lru-cache";
import type { AgentLoopContext } from "../agent-loop/agent-loop.ts";
import { AuthError, ConflictError, EdgeloopError, InputError, NotFoundError } from "../errors.ts";
import { fnv1a32 } from "../inference/hash.ts";
import type { InferenceClient } from "../inference/types.ts";
import { isStaleStep, type SessionStorage } from "../session/session-storage.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import { constantTimeEqual } from "../tools/signature.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import { describeModelId, modelIdOf, sameModel } from "../models/model-id.ts";
import {
  AgentSessionInput,
  applyEvent,
  foldAgentSession,
  newAgentState,
  tokenSha256,
  toolsKeyOf,
  type AgentSessionEvent,
  type AgentSessionInputArg,
  type AgentSessionState,
  type FinishEvent,
} from "./agent-session.ts";
import { continuation, jsonEqual } from "./conversation.ts";
import { GatewayTurns } from "./gateway-turn.ts";
import type { TurnSink } from "./turn-stream.ts";
import { parseChatRequest, type ChatReply, type ChatRequest } from "./openai-wire.ts";
export { samplingFor } from "./gateway-turn.ts";

/** Options of {@link AgentGateway}. */
export interface AgentGatewayOptions {
  /** Where sessions live (memory, Redis, Durable Object storage): each under `agent:{key}`. */
  storage: SessionStorage;
  tokenizer: ChatTokenizer;
  /** The engine (token-in/token-out; the session key is the sticky routing key). */
  client: InferenceClient;
  /** The engine's context (as {@link AgentLoopContext.maxModelLen}). */
  maxModelLen?: number;
  /** The model name `GET …/models` and replies report (default the tokenizer's name). */
  modelName?: string;
  /** Epoch milliseconds (deadlines, `created`); default `Date.now()`. */
  wallClockMs?: () => number;
  /** Fresh engine request ids (default `crypto.randomUUID()`). */
  newRequestId?: () => string;
  /** How often a waiting loop re-reads a session another process may have finished, ms (default 500). */
  pollMs?: number;
  /** Folded sessions kept in memory (default 10 000; a session is re-read when another process moved it on). */
  cacheSize?: number;
  /** Seconds a session is kept after its deadline (default 7 days). */
  retainSeconds?: number;
  /** Per-session outputs, engine calls and reward range (config `limits`; default `DEFAULT_SESSION_LIMITS`). */
  limits?: SessionLimits;
}

/** A session closed by its finish call, the task's answer, its deadline or its trajectory's failure: 409, code `session_closed`. */
export class SessionClosedError extends ConflictError {
  override name = "SessionClosedError";
  constructor(key: string, by: string, detail?: string) {
    const why = by === "timeout" ? "its deadline passed" : by === "failed" ? "its trajectory failed" : by === "task" ? "finished by the task's answer" : "finished";
    super(`agent session '${key.slice(0, 200)}' is closed (${why}${detail ? `; ${detail}` : ""}); no more calls are answered`, { code: "session_closed" });
  }
}

/**
 * What a call's transport says about it, besides its body: whether it is a
 * client's retry of an earlier attempt, and its idempotency key. Read from
 * the request headers by {@link turnOptionsOf}.
 */
export interface TurnOptions {
  /** A retry of an earlier attempt (`x-stainless-retry-count` ≥ 1): an equal answered call is replayed. */
  retry?: boolean;
  /** The `Idempotency-Key` header: the same key with the same body is replayed, with another body refused (422). */
  idempotencyKey?: string;
}

/** Longest `Idempotency-Key` accepted, characters (Stripe's limit). */
export const MAX_IDEMPOTENCY_KEY = 255;

/**
 * The {@link TurnOptions} of a request's headers: `retry` when
 * `x-stainless-retry-count` is an integer ≥ 1 — the openai (v6) and
 * `@anthropic-ai/sdk` (v1) SDKs send it on every attempt, `0` on the first;
 * any other value counts as a first attempt — and `idempotencyKey` from
 * `Idempotency-Key` (trimmed; neither SDK sends one by default, an
 * application sets it per call with the request option `headers`).
 * @throws InputError (400, field `Idempotency-Key`) for an empty key or one over {@link MAX_IDEMPOTENCY_KEY} characters.
 */
export function turnOptionsOf(headers: Headers): TurnOptions {
  const count = headers.get("x-stainless-retry-count")?.trim();
  const retry = count !== undefined && /^\d+$/.test(count) && Number(count) >= 1;
  const raw = headers.get("idempotency-key");
  if (raw === null) return { retry };
  const idempotencyKey = raw.trim();
  if (idempotencyKey === "" || idempotencyKey.length > MAX_IDEMPOTENCY_KEY) {
    throw new InputError("Idempotency-Key", `expected 1 to ${MAX_IDEMPOTENCY_KEY} characters, got ${idempotencyKey.length}`);
  }
  return { retry, idempotencyKey };
}

/**
 * An `Idempotency-Key` reused with another request body: 422, code
 * `idempotency_key_reused`, field `Idempotency-Key` (neither SDK retries a 422).
 * @see draft-ietf-httpapi-idempotency-key-header §2.7 (422 for a key reused with a different payload; Stripe answers 400 there)
 */
export class IdempotencyKeyReusedError extends EdgeloopError {
  override name = "IdempotencyKeyReusedError";
  constructor(key: string) {
    super(`Idempotency-Key '${key.slice(0, 100)}' was already used with another request body in this session; send a new key for a new request`, { status: 422, code: "idempotency_key_reused", field: "Idempotency-Key" });
  }
}

/**
 * The agent gateway's sessions (DESIGN §6; runtime-free): each agent
 * conversation is a durable session whose every answered chat call is one
 * committed event ({@link TurnEvent}) in `storage`, fenced by its step.
 *
 * A call is answered as follows (one at a time per key in this process):
 * 1. a replay — the stored reply again, no engine call — for a call with an
 *    `Idempotency-Key` the session answered before (with the same body;
 *    another body is a 422), or a retry (`x-stainless-retry-count` ≥ 1: the
 *    SDKs retry connection errors, 408, 409, 429 and 5xx) equal to one of the
 *    session's last 16 answered calls (same messages, tools and sampling
 *    fields, {@link requestHash}). A retry arriving while its first attempt is
 *    still being answered in this process waits for it and replays it. An
 *    equal request that is neither is a new sample (a framework re-asking at
 *    temperature 1): it is no continuation (its messages lack the reply), so
 *    it opens a sibling output by step 3 with its own engine call;
 * 2. a request that repeats the current output's conversation exactly and
 *    adds one observation (tool results, or one user turn) continues that
 *    output: the new messages are encoded incrementally (the observation
 *    encoder of `tool_agent`, mask 0) and the engine is sent the exact token
 *    stream so far — sampled text is never re-rendered;
 * 3. anything else (history edited, dropped, reordered, other tools, or the
 *    current output ended by a budget) opens the next output with a fresh
 *    render of the request's messages.
 * Then one engine call (preemption-resumed like every loop's) with
 * `max_tokens = min(request's, remaining budget)`; the reply is parsed with
 * the run's tool-call parser and the event committed before it is returned.
 * A commit that loses the step fence (another process moved the session on)
 * is not answered from this process's state: the session is re-read and the
 * request answered from it — a replay when the call that won the fence was
 * this one's (its key, or an equal request: its retry answered elsewhere) —
 * or refused (409).
 */
export class AgentGateway {
  readonly tokenizer: ChatTokenizer;
  readonly modelName: string;
  private readonly opts: AgentGatewayOptions;
  private readonly cache: LRUCache<string, AgentSessionState>;
  private readonly chains = new KeyedChain();
  private readonly listeners = new Map<string, Set<() => void>>();
  /** Answers a call's turn: the output continued or opened, the engine call, the reply parsed. */
  private readonly turns: GatewayTurns;

  constructor(opts: AgentGatewayOptions) {
    this.opts = opts;
    this.tokenizer = opts.tokenizer;
    this.modelName = opts.modelName ?? opts.tokenizer.name;
    this.cache = new LRUCache({ max: opts.cacheSize ?? 10_000 });
    this.turns = new GatewayTurns(opts, this.modelName, () => this.wall());
  }

  /** The storage key of a session: `agent:{key}`, the key encoded by {@link keyPart} (unchanged for a trajectory key). */
  static storageKey(key: string): string {
    return `agent:${keyPart(key)}`;
  }

  /**
   * Creates the session of `input.key`, or returns the stored one when it
   * exists (a loop resumed after a crash finds its session and token again).
   * A store outage is waited out (the loop's side is held, never failed, for one).
   * @throws InputError for a malformed input; StoreError when storage fails otherwise.
   */
  async create(input: AgentSessionInputArg): Promise<AgentSessionState> {
    const parsed = AgentSessionInput.parse(input);
    if (parsed.token === undefined) throw new InputError("token", "create needs the session's bearer token");
    // The token is stored only as its SHA-256 (S17): whoever reads the store cannot act as the agent.
    const { token, ...rest } = parsed;
    // The session names this gateway's model: a call reaching a gateway of another model is refused (N4).
    const inp: AgentSessionInput = { ...rest, model: rest.model ?? (await modelIdOf(this.tokenizer)), token_sha256: await tokenSha256(token) };
    return holdWhileStoreDown(() => this.createOnce(inp, token));
  }

  private createOnce(inp: AgentSessionInput, token: string): Promise<AgentSessionState> {
    return this.serial(inp.key, async () => {
      const existing = await this.load(inp.key);
      if (existing) return existing;
      const st = newAgentState(inp);
      await this.commit(st, { e: "open" }, JSON.stringify(inp));
      st.token = token;
      return st;
    });
  }

  /**
   * Gives the session a new bearer token (stored as its SHA-256; the old one
   * stops working) and returns the state holding it in clear: for a loop that
   * resumed a session whose task was never sent (a stored session keeps no
   * token to send). Returns the state unchanged when it already holds its token.
   * @throws NotFoundError for an unknown key.
   */
  async rekey(key: string, token: string): Promise<AgentSessionState> {
    const sha256 = await tokenSha256(token);
    for (let attempt = 0; ; attempt++) {
      try {
        return await holdWhileStoreDown(() =>
          this.serial(key, async () => {
            const st = await this.load(key);
            if (!st) throw new NotFoundError(`no agent session '${key.slice(0, 200)}'`, { field: "key" });
            if (st.token !== undefined) return st;
            await this.commit(st, { e: "token", sha256 });
            st.token = token;
            return st;
          }),
        );
      } catch (e) {
        if (!isStaleStep(e) || attempt >= 5) throw e;
      }
    }
  }

  /** The session of `key` as stored now, or null. */
  async get(key: string): Promise<AgentSessionState | null> {
    return this.serial(key, () => this.load(key));
  }

  /**
   * Checks a bearer token against the session's.
   * @throws NotFoundError (404) for an unknown key; AuthError (401) for a missing or wrong token.
   */
  async authorize(key: string, token: string | null): Promise<AgentSessionState> {
    const st = await this.get(key);
    if (!st) throw new NotFoundError(`no agent session '${key.slice(0, 200)}'`, { field: "key" });
    const want = st.tokenSha256 ?? (st.input.token !== undefined ? await tokenSha256(st.input.token) : null);
    if (!token || want === null || !constantTimeEqual(await tokenSha256(token), want)) throw new AuthError(`wrong or missing bearer token for agent session '${key.slice(0, 200)}'`);
    return st;
  }

  /**
   * Answers one chat-completions call of session `key` (see the class doc).
   * @throws NotFoundError (404), AuthError (401), InputError (400, naming the field),
   *   {@link SessionClosedError} (409), SessionLimitError (409, `session_limit`: the session
   *   reached `limits.max_outputs_per_session` or `limits.max_engine_calls_per_session` and fails),
   *   engine errors (502/503, the SDK retries them).
   */
  async chat(key: string, token: string | null, body: unknown, opts: TurnOptions = {}): Promise<ChatReply> {
    await this.authorize(key, token);
    return this.chatAuthorized(key, body, opts);
  }

  /**
   * {@link chat} for a caller that has just checked the token with {@link authorize}
   * (the HTTP function does, before it reads the body).
   * @throws as {@link chat}, less the 401.
   */
  async chatAuthorized(key: string, body: unknown, opts: TurnOptions = {}): Promise<ChatReply> {
    return this.turnAuthorized(key, parseChatRequest(body), opts);
  }

  /**
   * One turn of an authorized session from a parsed {@link ChatRequest}: what
   * every API of the session's base URL (chat completions, and the Responses
   * and Messages adapters, which translate their bodies into a ChatRequest)
   * calls. The same continuation, replay and limit rules as {@link chat};
   * `opts` (from the headers, {@link turnOptionsOf}) decides whether an
   * equal earlier call is replayed or sampled again (the class doc, step 1).
   * `sink`: the turn streams into it while sampled (see `TurnStream`); the
   * returned reply (after the commit) completes it. A replay streams nothing.
   * @throws as {@link chatAuthorized}; {@link IdempotencyKeyReusedError} (422).
   */
  async turnAuthorized(key: string, req: ChatRequest, opts: TurnOptions = {}, sink?: TurnSink): Promise<ChatReply> {
    const hash = requestHash(req);
    /** The id of the reply stored under `hash` when this call first read the session (undefined: none). */
    let before: string | undefined;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.serial(key, async () => {
          const st = await this.load(key);
          if (!st) throw new NotFoundError(`no agent session '${key.slice(0, 200)}'`, { field: "key" });
          const again = replayOf(st, hash, opts, attempt === 0 ? null : before);
          if (again) return again;
          if (attempt === 0) before = st.recent.get(hash)?.id;
          if (st.finish) throw new SessionClosedError(key, st.finish.by);
          if (this.wall() >= st.input.deadline_ms) throw new SessionClosedError(key, "timeout");
          const own = await modelIdOf(this.tokenizer);
          if (st.input.model && !sameModel(st.input.model, own)) {
            // Another model's tokens would enter this trajectory: the session fails (its trajectory names both) and the call is refused.
            const why = `agent session '${key.slice(0, 200)}' was created with model ${describeModelId(st.input.model)}, this gateway runs ${describeModelId(own)}: refused (route agent calls to a process of the session's model)`;
            await this.commit(st, { e: "finish", by: "failed", reward: null, metadata: { error: why } });
            throw new ConflictError(why, { code: "model_mismatch" });
          }
          if (req.logprobs && !st.input.sampling_params.logprobs) {
            throw new InputError("logprobs", "this run does not record log-probs (rollout.calculate_log_probs is false); ask without logprobs");
          }
          try {
            this.checkLimits(st, req);
          } catch (e) {
            // Past a per-session limit the session fails (its trajectory with this reason) and the call is refused.
            if (e instanceof SessionLimitError) await this.commit(st, { e: "finish", by: "failed", reward: null, metadata: { error: e.message } });
            throw e;
          }
          try {
            const ev = await this.turns.answer(st, req, hash, { ...(opts.idempotencyKey !== undefined ? { idempotencyKey: opts.idempotencyKey } : {}), resample: st.recent.has(hash), ...(sink && attempt === 0 ? { sink } : {}) });
            await this.commit(st, ev);
            return ev.reply as unknown as ChatReply;
          } catch (e) {
            // The state may hold half a turn: drop it; the next call reads the session again.
            this.cache.delete(key);
            throw e;
          }
        });
      } catch (e) {
        // Another process answered a call of this session meanwhile: read it again (a replay, a
        // continuation of its reply, or a refusal), never answer from the stale state.
        if (!isStaleStep(e) || attempt >= 3) throw e;
      }
    }
  }

  /**
   * Records that the client of reply `replyId` (a chat completion id,
   * `chatcmpl-{h}-{output}-{turn}-{step}`) went away before it received it:
   * an {@link AbandonEvent} for that output's turn, when it is still the
   * output's last turn (a client that already continued from it did get it).
   * Idempotent; a reply that sampled nothing, or an id of another form, is ignored.
   * @throws StoreError when storage fails.
   */
  async abandon(key: string, replyId: string): Promise<void> {
    const m = /-(\d+)-(\d+)-(\d+)$/.exec(replyId);
    if (!m) return;
    const [output, turn] = [Number(m[1]), Number(m[2])];
    for (let attempt = 0; ; attempt++) {
      try {
        await this.serial(key, async () => {
          const st = await this.load(key);
          const out = st?.outputs[output];
          if (!st || !out?.lastAction || out.lastAction.turn !== turn || out.abandoned?.turn === turn) return;
          await this.commit(st, { e: "abandon", output, turn });
        });
        return;
      } catch (e) {
        if (!isStaleStep(e) || attempt >= 5) throw e;
      }
    }
  }

  /**
   * Refuses a call past the session's limits: an engine call beyond
   * `limits.max_engine_calls_per_session`, or a call that would open an output
   * beyond `limits.max_outputs_per_session` (a continuation of the current
   * output opens none).
   * @throws SessionLimitError (409, code `session_limit`)
   */
  private checkLimits(st: AgentSessionState, req: ChatRequest): void {
    const limits = this.opts.limits ?? DEFAULT_SESSION_LIMITS;
    if (st.engineCalls >= limits.maxEngineCalls) throw new SessionLimitError(st.input.key, "max_engine_calls_per_session", limits.maxEngineCalls);
    if (st.outputs.length < limits.maxOutputs) return;
    const cur = st.outputs[st.outputs.length - 1];
    const tools = req.tools && req.tools.length ? req.tools : undefined;
    const continues = cur && !cur.ended && cur.toolsKey === toolsKeyOf(tools) && continuation(cur.messages, req.messages) !== null;
    if (!continues) throw new SessionLimitError(st.input.key, "max_outputs_per_session", limits.maxOutputs);
  }

  /**
   * Ends the session. `by`: `agent` (`POST …/finish`), `task` (the task's
   * answer), `timeout` (the deadline), `failed` (the trajectory failed). The
   * first end is kept: the agent repeating its own finish gets it again, an
   * agent's finish that would change it is refused; other late ends return it.
   * @throws InputError (400, `reward`) for an agent's or task's reward outside `limits.reward_min`/`reward_max`;
   *   NotFoundError for an unknown key; {@link SessionClosedError} (409) for an agent's
   *   finish after another end or with another reward or metadata.
   */
  async finish(key: string, r: { by: FinishEvent["by"]; reward?: number | null; metadata?: Record<string, unknown> | null }): Promise<AgentSessionState> {
    if (r.by === "agent" || r.by === "task") checkReward(r.reward, this.opts.limits ?? DEFAULT_SESSION_LIMITS, "reward");
    for (let attempt = 0; ; attempt++) {
      try {
        const st = await this.serial(key, async () => {
          const st = await this.load(key);
          if (!st) throw new NotFoundError(`no agent session '${key.slice(0, 200)}'`, { field: "key" });
          if (st.finish) {
            // The agent repeating its own finish (a retry) is answered again; any other late finish is refused,
            // so that an agent never believes an outcome was recorded that was not.
            const same = r.by === "agent" && st.finish.by === "agent" && st.finish.reward === (r.reward ?? null) && jsonEqual(st.finish.metadata, r.metadata ?? null);
            if (r.by === "agent" && !same) {
              throw new SessionClosedError(key, st.finish.by, st.finish.by === "agent" ? `already finished with reward ${JSON.stringify(st.finish.reward)}` : undefined);
            }
            return st;
          }
          await this.commit(st, { e: "finish", by: r.by, reward: r.reward ?? null, metadata: r.metadata ?? null });
          return st;
        });
        this.notify(key);
        return st;
      } catch (e) {
        if (!isStaleStep(e) || attempt >= 5) throw e;
      }
    }
  }

  /** Records that the agent webhook accepted the task (not sent again when the loop resumes). */
  async markTaskSent(key: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await holdWhileStoreDown(() => this.serial(key, async () => {
          const st = await this.load(key);
          if (!st || st.taskSent || st.finish) return;
          await this.commit(st, { e: "task" });
        }));
        return;
      } catch (e) {
        if (!isStaleStep(e) || attempt >= 5) throw e;
      }
    }
  }

  /**
   * Resolves with the session once it is finished — by this process
   * (notified at once) or another (read every `pollMs`) — or, at its
   * deadline, finishes it as `timeout` (fenced: a call committed first is
   * kept) and resolves with that.
   * @throws NotFoundError when the session vanished (its store lost it).
   */
  async waitFinished(key: string, signal?: AbortSignal): Promise<AgentSessionState> {
    const poll = this.opts.pollMs ?? 500;
    for (;;) {
      // The loop's side waits a store outage out (its agent's calls meanwhile get 503s, which clients retry).
      const st = await holdWhileStoreDown(() => this.get(key));
      if (!st) throw new NotFoundError(`agent session '${key.slice(0, 200)}' vanished from its store`, { field: "key" });
      if (st.finish) return st;
      const left = st.input.deadline_ms - this.wall();
      if (left <= 0) return holdWhileStoreDown(() => this.finish(key, { by: "timeout" }));
      if (signal?.aborted) throw signal.reason ?? new Error("aborted");
      await new Promise<void>((resolve) => {
        const set = this.listeners.get(key) ?? new Set();
        const done = () => {
          clearTimeout(t);
          set.delete(done);
          if (set.size === 0) this.listeners.delete(key);
          resolve();
        };
        const t = setTimeout(done, Math.max(1, Math.min(poll, left)));
        set.add(done);
        this.listeners.set(key, set);
      });
    }
  }

  /** Drops the session's cached state (tests; a store that lost data). */
  forget(key: string): void {
    this.cache.delete(key);
  }

  /** Sessions held in memory (benchmarks). */
  get cached(): number {
    return this.cache.size;
  }

  private notify(key: string): void {
    for (const f of [...(this.listeners.get(key) ?? [])]) f();
  }

  /** The session's state: the cached fold when storage says no one moved it on, else read and folded again. */
  private async load(key: string): Promise<AgentSessionState | null> {
    const sk = AgentGateway.storageKey(key);
    const cached = this.cache.get(key);
    if (cached && this.opts.storage.stepOf) {
      const step = await this.opts.storage.stepOf(sk);
      if (step === cached.step) return cached;
    }
    const stored = await this.opts.storage.get(sk);
    if (!stored || stored.step < 0) {
      this.cache.delete(key);
      return null;
    }
    const st = foldAgentSession(key, stored);
    this.cache.set(key, st);
    return st;
  }

  /** Appends `ev` at the next step (the input with the first) and applies it, unless `turn` already did. */
  private async commit(st: AgentSessionState, ev: AgentSessionEvent, inputJson?: string): Promise<void> {
    const step = st.step + 1;
    const ttl = Math.max(60, Math.ceil((st.input.deadline_ms - this.wall()) / 1000)) + (this.opts.retainSeconds ?? 7 * 24 * 3600);
    try {
      await this.opts.storage.append(AgentGateway.storageKey(st.input.key), step, JSON.stringify(ev), { ...(inputJson !== undefined ? { input: inputJson } : {}), ttlSeconds: ttl });
    } catch (e) {
      this.cache.delete(st.input.key);
      throw e;
    }
    if (ev.e !== "turn") applyEvent(st, ev);
    else if (ev.action) st.engineCalls++; // turn() applied the rest of a live turn already
    st.step = step;
    this.cache.set(st.input.key, st);
  }

  private wall(): number {
    return (this.opts.wallClockMs ?? Date.now)();
  }

  /** Runs `fn` after every earlier operation on `key` in this process. */
  private serial<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.chains.run(key, fn);
  }
}

/**
 * The stored reply a call is answered with instead of sampling (the
 * gateway's class doc, step 1), or null. `lostTo`: on a re-read after a lost
 * step fence, the id of the reply stored under `hash` at the first read — a
 * reply under `hash` other than it was committed meanwhile by another process
 * for an equal call (this call's retry) and is replayed; null on the first read.
 * @throws IdempotencyKeyReusedError when the call's key was answered for another body.
 */
function replayOf(st: AgentSessionState, hash: string, opts: TurnOptions, lostTo: string | undefined | null): ChatReply | null {
  if (opts.idempotencyKey !== undefined) {
    const k = st.keyed.get(opts.idempotencyKey);
    if (!k) return null;
    if (k.hash !== hash) throw new IdempotencyKeyReusedError(opts.idempotencyKey);
    return k.reply;
  }
  const r = st.recent.get(hash);
  if (!r) return null;
  if (opts.retry) return r;
  return lostTo !== null && r.id !== lostTo ? r : null;
}

/**
 * A hash of what makes two requests the same call: messages, tools, tool
 * choice and sampling fields (not `stream`: a retried call may stream or not).
 * FNV-1a over the canonical JSON, twice with different seeds (64 bits).
 */
export function requestHash(req: ChatRequest): string {
  const { stream: _s, include_usage: _u, ...rest } = req;
  const s = JSON.stringify(rest);
  return fnv1a32(s).toString(16).padStart(8, "0") + fnv1a32(s, 0x9747b28c).toString(16).padStart(8, "0") + s.length.toString(16);
}
