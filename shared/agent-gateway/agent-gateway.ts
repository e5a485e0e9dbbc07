import { keyPart } from "../store/key-encoding.ts";
import { checkReward, DEFAULT_SESSION_LIMITS, SessionLimitError, type SessionLimits } from "../agent-loop/session-limits.ts";
import { KeyedChain } from "../session/keyed-chain.ts";
import { LRUCache } from "lru-cache";
import type { AgentLoopContext } from "../agent-loop/agent-loop.ts";
import { AuthError, ConfigError, ConflictError, EdgeloopError, InputError, NotFoundError } from "../errors.ts";
import { fnv1a32x2Hex } from "../inference/hash.ts";
import type { InferenceClient } from "../inference/types.ts";
import { isStaleStep, type SessionStorage } from "../session/session-storage.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import { constantTimeEqual } from "../tools/signature.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import { describeModelId, modelIdOf, sameModel } from "../models/model-id.ts";
import { AgentRoleName } from "../schema/agent-role.ts";
import { DEFAULT_POOL } from "../config/app-config.ts";
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
import { jsonEqual } from "./conversation.ts";
import { planTurn } from "./trajectory-tree.ts";
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
  /** Further engine pools by name (config `engine.pools`); `client` is the pool {@link DEFAULT_POOL_NAME}. */
  pools?: Record<string, EnginePool>;
  /**
   * Agent role → pool name (config `agent.roles`; a key of `pools` or
   * {@link DEFAULT_POOL_NAME}). Absent or empty: no roles configured — any
   * role is accepted, recorded and served by `client`. Given: a role not
   * listed is a 400.
   */
  roles?: Record<string, string>;
}

/** The pool name of {@link AgentGatewayOptions.client} in `roles` (config: the `engine` section, `DEFAULT_POOL`). */
export const DEFAULT_POOL_NAME = DEFAULT_POOL;

/** One named engine pool of the gateway: its client (sticky per session key within the pool) and model. */
export interface EnginePool {
  client: InferenceClient;
  /** The model name its replies report and its records carry as `served_model` (default: the pool's name). */
  modelName?: string;
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
  /** The `X-Agent-Role` header: the call's agent role, over the session's `agent_role` (see {@link AgentGateway}, "Agent roles"). */
  role?: string;
}

/** Longest `Idempotency-Key` accepted, characters (Stripe's limit). */
export const MAX_IDEMPOTENCY_KEY = 255;

/**
 * The {@link TurnOptions} of a request's headers: `retry` when
 * `x-stainless-retry-count` is an integer ≥ 1 — the openai (v6) and
 * `@anthropic-ai/sdk` (v1) SDKs send it on every attempt, `0` on the first;
 * any other value counts as a first attempt — `idempotencyKey` from
 * `Idempotency-Key` (trimmed; neither SDK sends one by default, an
 * application sets it per call with the request option `headers`), and
 * `role` from `X-Agent-Role` (trimmed; an {@link AgentRoleName}).
 * @throws InputError (400, field `Idempotency-Key`) for an empty key or one over {@link MAX_IDEMPOTENCY_KEY} characters;
 *   (400, field `X-Agent-Role`) for a role that is no {@link AgentRoleName}.
 */
export function turnOptionsOf(headers: Headers): TurnOptions {
  const count = headers.get("x-stainless-retry-count")?.trim();
  const retry = count !== undefined && /^\d+$/.test(count) && Number(count) >= 1;
  const roleHeader = headers.get("x-agent-role");
  let role: { role?: string } = {};
  if (roleHeader !== null) {
    const r = AgentRoleName.safeParse(roleHeader.trim());
    if (!r.success) throw new InputError("X-Agent-Role", `${r.error.issues[0]!.message}, got ${JSON.stringify(roleHeader.slice(0, 100))}`);
    role = { role: r.data };
  }
  const raw = headers.get("idempotency-key");
  if (raw === null) return { retry, ...role };
  const idempotencyKey = raw.trim();
  if (idempotencyKey === "" || idempotencyKey.length > MAX_IDEMPOTENCY_KEY) {
    throw new InputError("Idempotency-Key", `expected 1 to ${MAX_IDEMPOTENCY_KEY} characters, got ${idempotencyKey.length}`);
  }
  return { retry, idempotencyKey, ...role };
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
 *    it opens a sibling output by step 3 (a branch at the turn it repeats)
 *    with its own engine call;
 * 2. a request that repeats the current output's conversation (or that of
 *    any earlier output not ended: a leaf of the session's trajectory tree)
 *    exactly and adds one observation (tool results, or one user turn)
 *    continues that output: the new messages are encoded incrementally (the
 *    observation encoder of `tool_agent`, mask 0) and the engine is sent the
 *    exact token stream so far — sampled text is never re-rendered;
 * 3. anything else (history edited, dropped, reordered, other tools, or the
 *    current output ended by a budget) opens the next output: a branch of the
 *    session's trajectory tree at the deepest point of an earlier output the
 *    request extends (sharing its tokens, see `planTurn`), else a fresh root
 *    rendered from the request's messages.
 * Then one engine call (preemption-resumed like every loop's) with
 * `max_tokens = min(request's, remaining budget)`; the reply is parsed with
 * the run's tool-call parser and the event committed before it is returned.
 * A commit that loses the step fence (another process moved the session on)
 * is not answered from this process's state: the session is re-read and the
 * request answered from it — a replay when the call that won the fence was
 * this one's (its key, or an equal request: its retry answered elsewhere) —
 * or refused (409).
 *
 * Agent roles: a call's role is its `X-Agent-Role` header, else the
 * session's `agent_role` (the row's), else none. With `roles` configured, a
 * role is sent to its pool (sticky per session key within the pool) and a
 * role not listed is a 400 naming `X-Agent-Role` (or `agent_role`) and the
 * known roles; without, any role is served by `client` and recorded. A call
 * without a role uses `client`. An output holds one role's calls only: a
 * call whose role differs from the current output's opens a new output
 * (never continues it), so each record carries its own `agent_role` and
 * `served_model`, and a role's tokens never land in another's record.
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
  /** The turns of each further pool (`opts.pools`) and the model name it serves. */
  private readonly poolTurns = new Map<string, { turns: GatewayTurns; modelName: string }>();

  /** @throws ConfigError when `roles` names a pool that is neither in `pools` nor {@link DEFAULT_POOL_NAME}. */
  constructor(opts: AgentGatewayOptions) {
    this.opts = opts;
    this.tokenizer = opts.tokenizer;
    this.modelName = opts.modelName ?? opts.tokenizer.name;
    this.cache = new LRUCache({ max: opts.cacheSize ?? 10_000 });
    this.turns = new GatewayTurns(opts, this.modelName, () => this.wall());
    for (const [name, pool] of Object.entries(opts.pools ?? {})) {
      const modelName = pool.modelName ?? name;
      this.poolTurns.set(name, { turns: new GatewayTurns({ ...opts, client: pool.client }, modelName, () => this.wall()), modelName });
    }
    for (const [role, pool] of Object.entries(opts.roles ?? {})) {
      if (pool !== DEFAULT_POOL_NAME && !this.poolTurns.has(pool)) throw new ConfigError(`agent.roles.${role}`, `unknown pool "${pool}" (known pools: ${[DEFAULT_POOL_NAME, ...this.poolTurns.keys()].map((p) => `"${p}"`).join(", ")})`);
    }
  }

  /** The configured agent roles (`roles`' keys), in order; empty when none are configured. */
  get roles(): string[] {
    return Object.keys(this.opts.roles ?? {});
  }

  /**
   * The model name a call of `role` is served by (replies' `model`, records'
   * `served_model`): its pool's, or {@link modelName} for no role, an
   * unconfigured role or the default pool.
   */
  modelNameFor(role: string | undefined): string {
    const roles = this.opts.roles;
    // Own keys only: a role named "__proto__" or "constructor" is no configured role.
    const pool = role === undefined || !roles || !Object.hasOwn(roles, role) ? undefined : roles[role];
    return (pool !== undefined ? this.poolTurns.get(pool)?.modelName : undefined) ?? this.modelName;
  }

  /**
   * The turns and the recorded role of a call of `role` (undefined: no role).
   * @throws InputError (400) naming `field` and the known roles for a role `roles` does not list.
   */
  private routeRole(role: string | undefined, field: string): { turns: GatewayTurns; role?: { name: string; servedModel: string } } {
    if (role === undefined) return { turns: this.turns };
    const roles = this.opts.roles;
    if (!roles || Object.keys(roles).length === 0) return { turns: this.turns, role: { name: role, servedModel: this.modelName } };
    // Own keys only: "__proto__", "constructor" and "toString" name no configured role (a fresh-user trial got 200 for them).
    const pool = Object.hasOwn(roles, role) ? roles[role] : undefined;
    if (pool === undefined) throw new InputError(field, `unknown agent role "${role}"; known roles: ${Object.keys(roles).map((r) => `"${r}"`).join(", ")}`);
    const p = pool === DEFAULT_POOL_NAME ? undefined : this.poolTurns.get(pool);
    return p ? { turns: p.turns, role: { name: role, servedModel: p.modelName } } : { turns: this.turns, role: { name: role, servedModel: this.modelName } };
  }

  /** The storage key of a session: `agent:{key}`, the key encoded by {@link keyPart} (unchanged for a trajectory key). */
  static storageKey(key: string): string {
    return `agent:${keyPart(key)}`;
  }

  /**
   * Creates the session of `input.key`, or returns the stored one when it
   * exists (a loop resumed after a crash finds its session and token again).
   * A store outage is waited out (the loop's side is held, never failed, for one).
   * @throws InputError for a malformed input, or an `agent_role` that `roles` does not list; StoreError when storage fails otherwise.
   */
  async create(input: AgentSessionInputArg): Promise<AgentSessionState> {
    const parsed = AgentSessionInput.parse(input);
    if (parsed.token === undefined) throw new InputError("token", "create needs the session's bearer token");
    // A task's role no pool serves is refused when the session is made, not at its first call.
    if (parsed.agent_role !== undefined) this.routeRole(parsed.agent_role, "agent_role");
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
    // The same body under another role is another call (never a replay of the other role's reply).
    const hash = requestHash(req) + (opts.role !== undefined ? `:${opts.role}` : "");
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
          const route = opts.role !== undefined ? this.routeRole(opts.role, "X-Agent-Role") : this.routeRole(st.input.agent_role, "agent_role");
          if (req.logprobs && !st.input.sampling_params.logprobs) {
            throw new InputError("logprobs", "this run does not record log-probs (rollout.calculate_log_probs is false); ask without logprobs");
          }
          try {
            this.checkLimits(st, req, route.role);
          } catch (e) {
            // Past a per-session limit the session fails (its trajectory with this reason) and the call is refused.
            if (e instanceof SessionLimitError) await this.commit(st, { e: "finish", by: "failed", reward: null, metadata: { error: e.message } });
            throw e;
          }
          try {
            const ev = await route.turns.answer(st, req, hash, { ...(opts.idempotencyKey !== undefined ? { idempotencyKey: opts.idempotencyKey } : {}), resample: st.recent.has(hash), ...(route.role ? { role: route.role } : {}), ...(sink && attempt === 0 ? { sink } : {}) });
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
   * output, by a call of its role, opens none).
   * @throws SessionLimitError (409, code `session_limit`)
   */
  private checkLimits(st: AgentSessionState, req: ChatRequest, role: { name: string } | undefined): void {
    const limits = this.opts.limits ?? DEFAULT_SESSION_LIMITS;
    if (st.engineCalls >= limits.maxEngineCalls) throw new SessionLimitError(st.input.key, "max_engine_calls_per_session", limits.maxEngineCalls);
    if (st.outputs.length < limits.maxOutputs) return;
    const tools = req.tools && req.tools.length ? req.tools : undefined;
    // A continuation of an output at its end (any leaf of the session's tree) opens none; a branch or a root does.
    if (planTurn(st, req.messages, toolsKeyOf(tools), role).kind !== "continue") throw new SessionLimitError(st.input.key, "max_outputs_per_session", limits.maxOutputs);
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
  return fnv1a32x2Hex(s, 0x811c9dc5, 0x9747b28c) + s.length.toString(16);
}
