import { holdWhileStoreDown } from "../store/store-outage.ts";
import { z } from "zod";
import { ConflictError, EngineUnavailableError } from "../errors.ts";
import type { RedisCommander } from "../store/redis-commander.ts";
import { replyToFields } from "../store/redis-transfer-queue.ts";
import { readTextCapped, redactUrl } from "../http/outbound.ts";
import { ENGINE_AUTH_HINT, joinUrl, type FetchLike } from "./engine-http.ts";
import type { GenerateRequest, InferenceClient } from "./types.ts";
import type { TokenOutput } from "../schema/index.ts";

/**
 * How `POST /v1/engine/pause` treats requests in flight at the engines
 * (vLLM's names): `abort` — they end now with the tokens generated so far and
 * edgeloop resumes them after the pause (partial tokens and log-probs kept,
 * `max_tokens` reduced: the agent loop's abort-resume path); `wait` — they run
 * to completion before the engines pause; `keep` — they are frozen in place
 * and continue after resume.
 */
export const EnginePauseMode = z.enum(["abort", "wait", "keep"]);
export type EnginePauseMode = z.infer<typeof EnginePauseMode>;

/**
 * Body of `POST /v1/engine/pause`: `{mode?: "abort"|"wait"|"keep" (default
 * abort, as vLLM), clear_cache?: bool (default false)}`. `clear_cache` with
 * `keep` is refused (field `clear_cache`): frozen requests hold their KV, so
 * vLLM ignores the flag then and SGLang's flush fails while they sit in its
 * running batch (see docs/engines.md §3.5).
 */
export const EnginePauseRequest = z
  .strictObject({
    mode: EnginePauseMode.default("abort"),
    clear_cache: z.boolean().default(false),
  })
  .refine((r) => !(r.clear_cache && r.mode === "keep"), {
    path: ["clear_cache"],
    message: "cannot be combined with mode keep: frozen requests keep their KV cache (vLLM ignores clear_cache then; SGLang's flush fails while they sit in its running batch). Pause with abort or wait to flush the cache",
  });
export type EnginePauseRequest = z.infer<typeof EnginePauseRequest>;

/** The deployment's pause gate as stored: paused or not, the mode, since when (epoch ms), and `epoch` (+1 per pause and per resume). */
export interface EngineGateState {
  paused: boolean;
  mode: EnginePauseMode | null;
  since_ms: number | null;
  epoch: number;
}

/**
 * What a gate read atomically with a call's admission ({@link EngineGate.run}).
 * `policy`: the deployment's current policy version (`{version, seq}`) as the
 * admission saw it, null when none was ever set, absent when this gate does
 * not read it (the memory gate; a Redis gate built without `policyKey`).
 * Being read by the admission itself, it is ordered after every
 * `POST /v1/model-version` that returned, at any process, before the call was
 * dispatched.
 */
export interface GateAdmission {
  policy?: { version: string | number; seq: number } | null;
}

/**
 * The client-side half of a pause, shared by every process of a deployment:
 * while closed, no new engine call starts (calls wait, then go after the
 * gate opens). Counts the calls in flight (past the gate, not yet answered),
 * which an SGLang `wait` pause waits for, and the calls admitted but not yet
 * sent (`starting`), which every pause waits for after closing the gate, so
 * that no call admitted just before the close reaches an engine after it paused.
 */
export interface EngineGate {
  state(): Promise<EngineGateState>;
  /** Closes the gate (a pause begins). */
  close(mode: EnginePauseMode): Promise<EngineGateState>;
  /** Opens the gate (the pause ends). */
  open(): Promise<EngineGateState>;
  /**
   * Runs `fn` once the gate is open, counted in flight while it runs.
   * `fn` calls `sent()` once its engine request is on its way (until then,
   * or until `fn` settles, the call counts as `starting`). Admission (the
   * gate is open → the call counts in flight) is atomic with respect to
   * {@link close}; `fn`'s second argument is what was read with it ({@link GateAdmission}).
   * @throws the signal's reason when `signal` aborts while waiting
   */
  run<T>(fn: (sent: () => void, admission: GateAdmission) => Promise<T>, signal?: AbortSignal): Promise<T>;
  /** Engine calls in flight in the deployment (every process). */
  inflight(): Promise<number>;
  /** Engine calls admitted by the gate whose request is not yet sent (every process). */
  starting(): Promise<number>;
}

/** In-process {@link EngineGate} (the memory store: one process). */
export class MemoryEngineGate implements EngineGate {
  private st: EngineGateState = { paused: false, mode: null, since_ms: null, epoch: 0 };
  private waiters: (() => void)[] = [];
  private active = 0;
  private unsent = 0;

  async state(): Promise<EngineGateState> {
    return { ...this.st };
  }
  async close(mode: EnginePauseMode): Promise<EngineGateState> {
    if (this.st.paused) this.st = { ...this.st, mode };
    else this.st = { paused: true, mode, since_ms: Date.now(), epoch: this.st.epoch + 1 };
    return { ...this.st };
  }
  async open(): Promise<EngineGateState> {
    if (this.st.paused) this.st = { paused: false, mode: null, since_ms: null, epoch: this.st.epoch + 1 };
    for (const w of this.waiters.splice(0)) w();
    return { ...this.st };
  }
  async run<T>(fn: (sent: () => void, admission: GateAdmission) => Promise<T>, signal?: AbortSignal): Promise<T> {
    while (this.st.paused) await waitFor(new Promise<void>((r) => this.waiters.push(r)), signal);
    this.active++;
    this.unsent++;
    let pending = true;
    const sent = () => {
      if (pending) (pending = false), this.unsent--;
    };
    try {
      return await fn(sent, {});
    } finally {
      sent();
      this.active--;
    }
  }
  async inflight(): Promise<number> {
    return this.active;
  }
  async starting(): Promise<number> {
    return this.unsent;
  }
}

/**
 * Admission, atomic with `close`: KEYS = gate, inflight, starting, and
 * optionally the policy hash; ARGV = member, inflight lease expiry, starting
 * lease expiry (epoch ms). Returns `[paused 0/1, epoch]`; when open, the
 * member is added to both sets and, with the policy key, the reply goes on
 * with its `current` (version JSON) and `seq` (nil when no version was set):
 * the version a call is stamped with, read in the same script, so it costs no
 * round trip and is ordered after every `set` that returned before the call.
 * (A Redis Cluster layout would need all four keys in one slot — one hash
 * tag around the prefix, e.g. `{edgeloop}:` — today they only share the prefix.)
 */
const ADMIT_LUA = `local g = redis.call('HMGET', KEYS[1], 'paused', 'epoch')
local e = tonumber(g[2] or '0') or 0
if g[1] == '1' then return {1, e} end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if KEYS[4] then
  local p = redis.call('HMGET', KEYS[4], 'current', 'seq')
  return {0, e, p[1], p[2]}
end
return {0, e}`;

/**
 * {@link EngineGate} in Redis, shared by the API and its workers:
 * `{p}engine:gate` HASH (`paused` 0/1, `mode`, `since`, `epoch`),
 * `{p}engine:inflight` ZSET (one member per call in flight, scored by its
 * lease expiry in epoch ms, so a crashed process's calls stop counting) and
 * `{p}engine:starting` ZSET (calls admitted, request not yet sent; a short
 * lease, `startLeaseMs`, default 10 s). With `policyKey` (the
 * `RedisPolicyVersions` hash, `{p}policy`) the admission also reads the
 * current policy version ({@link GateAdmission}).
 *
 * Cost per engine call: one EVAL on the call's path (gate read + both ZADDs
 * [+ the policy read], atomic, so a `close` either holds the call or sees it in flight), then the
 * two removals (sent, ended), which are not awaited by the call and are
 * coalesced per process: every removal queued in the same tick goes out as
 * one pipeline of at most one ZREM per set. A closed gate is polled every
 * `pollMs` (default 20). Runtime-free.
 */
export class RedisEngineGate implements EngineGate {
  readonly key: string;
  readonly inflightKey: string;
  readonly startingKey: string;
  private readonly policyKey?: string;
  private readonly pollMs: number;
  private readonly leaseMs: number;
  private readonly startLeaseMs: number;
  private readonly rem = { inflight: [] as string[], starting: [] as string[] };
  private scheduled = false;
  private lastFlush: Promise<void> = Promise.resolve();

  constructor(
    private readonly redis: RedisCommander,
    opts: { prefix?: string; pollMs?: number; leaseMs?: number; startLeaseMs?: number; policyKey?: string } = {},
  ) {
    const p = opts.prefix ?? "edgeloop:";
    this.key = `${p}engine:gate`;
    this.inflightKey = `${p}engine:inflight`;
    this.startingKey = `${p}engine:starting`;
    this.pollMs = opts.pollMs ?? 20;
    this.leaseMs = opts.leaseMs ?? 15 * 60_000;
    this.startLeaseMs = opts.startLeaseMs ?? 10_000;
    if (opts.policyKey !== undefined) this.policyKey = opts.policyKey;
  }

  async state(): Promise<EngineGateState> {
    const f = replyToFields(await this.redis.exec(["HGETALL", this.key]));
    return {
      paused: f.paused === "1",
      mode: f.paused === "1" ? ((f.mode as EnginePauseMode) ?? null) : null,
      since_ms: f.paused === "1" && f.since ? Number(f.since) : null,
      epoch: Number(f.epoch ?? 0),
    };
  }
  async close(mode: EnginePauseMode): Promise<EngineGateState> {
    const cur = await this.state();
    if (cur.paused) await this.redis.exec(["HSET", this.key, "mode", mode]);
    else await this.redis.pipeline([["HSET", this.key, "paused", "1", "mode", mode, "since", String(Date.now())], ["HINCRBY", this.key, "epoch", "1"]]);
    return this.state();
  }
  async open(): Promise<EngineGateState> {
    const cur = await this.state();
    if (cur.paused) await this.redis.pipeline([["HSET", this.key, "paused", "0"], ["HDEL", this.key, "mode", "since"], ["HINCRBY", this.key, "epoch", "1"]]);
    return this.state();
  }
  async run<T>(fn: (sent: () => void, admission: GateAdmission) => Promise<T>, signal?: AbortSignal): Promise<T> {
    const id = crypto.randomUUID();
    const keys = this.policyKey === undefined ? ["3", this.key, this.inflightKey, this.startingKey] : ["4", this.key, this.inflightKey, this.startingKey, this.policyKey];
    let admission: GateAdmission;
    for (;;) {
      const now = Date.now();
      // On the trajectory path: a store outage holds the call until the store answers again (a session
      // is held, never failed, for an outage), as the policy-version reads do.
      const r = (await holdWhileStoreDown(() => this.redis.exec(["EVAL", ADMIT_LUA, ...keys, id, String(now + this.leaseMs), String(now + this.startLeaseMs)]))) as unknown[];
      if (Number(r[0]) !== 1) {
        admission = this.policyKey === undefined ? {} : { policy: r[2] == null ? null : { version: JSON.parse(String(r[2])) as string | number, seq: Number(r[3]) } };
        break;
      }
      await waitFor(new Promise<void>((r) => setTimeout(r, this.pollMs)), signal);
    }
    let pending = true;
    const sent = () => {
      if (pending) (pending = false), this.remove("starting", id);
    };
    try {
      return await fn(sent, admission);
    } finally {
      sent();
      this.remove("inflight", id);
    }
  }
  async inflight(): Promise<number> {
    await this.lastFlush;
    return Number(await this.redis.exec(["ZCOUNT", this.inflightKey, String(Date.now()), "+inf"]));
  }
  async starting(): Promise<number> {
    await this.lastFlush;
    return Number(await this.redis.exec(["ZCOUNT", this.startingKey, String(Date.now()), "+inf"]));
  }

  /** Queues a removal; every removal queued until the next tick goes out in one pipeline (errors are dropped: the lease ends the member anyway). */
  private remove(set: "inflight" | "starting", id: string): void {
    this.rem[set].push(id);
    if (this.scheduled) return;
    this.scheduled = true;
    this.lastFlush = new Promise<void>((r) => setTimeout(r, 0)).then(async () => {
      this.scheduled = false;
      const cmds: string[][] = [];
      const s = this.rem.starting.splice(0);
      const f = this.rem.inflight.splice(0);
      if (s.length) cmds.push(["ZREM", this.startingKey, ...s]);
      if (f.length) cmds.push(["ZREM", this.inflightKey, ...f]);
      if (cmds.length) await this.redis.pipeline(cmds).catch(() => {});
    });
  }
}

function waitFor(p: Promise<void>, signal?: AbortSignal): Promise<void> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    });
  });
}

/**
 * An {@link InferenceClient} whose calls pass the {@link EngineGate} first: no
 * engine call starts while the deployment is paused. With `version`, every
 * reply that carries no engine-reported `extra_fields.model_version` is
 * stamped with the version `version(admission)` gave once the gate let the
 * call through (`admission`: what the gate read with it, {@link GateAdmission};
 * a call held through a weight update carries the new version);
 * `version()` returning null stamps nothing. The call counts as sent (see
 * {@link EngineGate.run}) once the inner client was called.
 */
export class GatedClient implements InferenceClient {
  constructor(
    readonly inner: InferenceClient,
    readonly gate: EngineGate,
    private readonly opts: { version?: (admission: GateAdmission) => Promise<string | number | null> } = {},
  ) {}
  generate(req: GenerateRequest): Promise<TokenOutput> {
    return this.gate.run(async (sent, admission) => {
      const v = this.opts.version ? await this.opts.version(admission) : null;
      const pending = this.inner.generate(req);
      sent();
      const out = await pending;
      if (v == null || out.extra_fields?.model_version != null) return out;
      return { ...out, extra_fields: { ...out.extra_fields, model_version: v } };
    }, req.signal);
  }
  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
  servableLength(contextLen: number): number {
    return this.inner.servableLength ? this.inner.servableLength(contextLen) : contextLen;
  }
}

/** One engine replica the control plane reaches: its base URL, how to fetch it (default global fetch) and the key its control routes take. */
export interface EngineReplicaTarget {
  url: string;
  fetch?: FetchLike;
  /**
   * Sent as `Authorization: Bearer` on every control call: SGLang's
   * `--admin-api-key` when the server has one, else its `--api-key` (SGLang's
   * control routes are `ADMIN_OPTIONAL`); vLLM's dev routes take none (its
   * `--api-key` guards `/v1` paths only), sending it is harmless.
   */
  apiKey?: string | null;
}

/** What one replica answered to a control call. */
export interface ReplicaControlResult {
  url: string;
  ok: boolean;
  status: number;
  /** `is_paused` (vLLM `GET /is_paused`); null when the engine cannot tell (SGLang has no such endpoint). */
  paused?: boolean | null;
  error?: string;
}

/** `{paused, mode, since_ms, epoch, inflight, replicas: [{url, ok, status, paused?, error?}]}`: `GET /v1/engine/status` and the pause/resume replies. */
export interface EngineStatus extends EngineGateState {
  inflight: number;
  replicas: ReplicaControlResult[];
}

/**
 * The weight-update protocol's engine side: pauses and resumes every
 * replica behind edgeloop through the engine's own API, and closes/opens the
 * deployment's {@link EngineGate} so no new call starts while paused.
 *
 * Wire forms, per `format`:
 * - vLLM (`vllm`, `vllm-generate`; dev/RL server, `VLLM_SERVER_DEV_MODE=1`):
 *   `POST /pause?mode=abort|wait|keep&clear_cache=true|false` (the mode as
 *   given), `POST /resume`, `GET /is_paused` → `{"is_paused": bool}`.
 *   @see https://docs.vllm.ai/en/latest/training/async_rl/ and `vllm/entrypoints/serve/rlhf/api_router.py`
 * - SGLang: `POST /pause_generation {"mode": "abort"|"in_place"|"retract"}`,
 *   `POST /continue_generation {}` (SGLang validates a JSON body there: a
 *   bodiless call is a 400), `POST /flush_cache {}`; `abort` → `abort`,
 *   `keep` → `in_place`, `wait` → the gate closes (no new call), edgeloop
 *   waits for its calls in flight to end, then `in_place`; `clear_cache` →
 *   `/flush_cache` after pausing (refused with `keep`, see {@link EnginePauseRequest}).
 *   Every SGLang control call carries a JSON body (`{}` at least).
 *   @see docs/engines.md §3.4–3.5; SGLang `http_server.py` (`PauseGenerationReqInput`, `ContinueGenerationReqInput`, `/flush_cache`)
 *
 * Order: pause = close the gate, wait for the calls it admitted before the
 * close to be sent (`EngineGate.starting`), then pause the replicas (concurrently);
 * resume = resume the replicas, then open the gate. A replica that fails is
 * reported in `replicas` (`ok: false`) and makes the call throw after the others were done.
 */
export class EngineControl {
  constructor(
    private readonly opts: {
      gate: EngineGate;
      format: "vllm" | "vllm-generate" | "sglang";
      replicas: () => EngineReplicaTarget[];
      /** Deadline of one control call at one replica, ms (default 600 000: a `wait` pause lasts as long as the longest request). */
      timeoutMs?: number;
      /** Poll period while an SGLang `wait` pause waits for edgeloop's calls, ms (default 20). */
      pollMs?: number;
    },
  ) {}

  get gate(): EngineGate {
    return this.opts.gate;
  }

  /**
   * Pauses the deployment (see the class doc).
   * A pause while paused: the same mode without `clear_cache` returns the current status and touches no engine; another mode or a flush is a {@link ConflictError} (409, field `mode`) — resume first.
   * @throws EngineUnavailableError (502) naming every replica that failed; the pause is then rolled back (the replicas that paused resumed, the gate opened): a 502 means nothing is paused
   * @throws ConflictError (409) when already paused with another mode, or asked to flush while paused
   */
  async pause(req: EnginePauseRequest): Promise<EngineStatus> {
    // A pause while paused changes nothing at the engines: the same mode (no flush) answers the current state;
    // anything else is a 409, so a failing second pause can never roll back (and so end) the first.
    const cur = await this.opts.gate.state();
    if (cur.paused) {
      if (cur.mode === req.mode && !req.clear_cache) return this.status();
      throw new ConflictError(`the engines are already paused (mode ${cur.mode} since ${new Date(cur.since_ms ?? 0).toISOString()}): POST /v1/engine/resume first, then pause with mode ${req.mode}${req.clear_cache ? " and clear_cache" : ""}`, { field: "mode" });
    }
    await this.opts.gate.close(req.mode);
    // Calls admitted just before the close go out before the engines pause (else one could arrive at a paused engine, be held, and run under the new weights stamped with the old version).
    while ((await this.opts.gate.starting()) > 0) await new Promise((r) => setTimeout(r, this.opts.pollMs ?? 5));
    const sglang = this.opts.format === "sglang";
    if (sglang && req.mode === "wait") {
      while ((await this.opts.gate.inflight()) > 0) await new Promise((r) => setTimeout(r, this.opts.pollMs ?? 20));
    }
    const results = await this.fanOut(async (t) => {
      if (!sglang) return this.call(t, "POST", `/pause?mode=${req.mode}&clear_cache=${req.clear_cache}`);
      const r = await this.call(t, "POST", "/pause_generation", { mode: req.mode === "abort" ? "abort" : "in_place" });
      if (!r.ok || !req.clear_cache) return r;
      return this.call(t, "POST", "/flush_cache", {});
    });
    if (results.some((r) => !r.ok)) {
      // All or nothing: a pause that failed at a replica is rolled back (the replicas that paused are resumed,
      // the gate opened), so a 502 always means "nothing is paused" and a trainer never leaves the gate shut.
      await this.fanOut((t) => this.resumeReplica(t));
      await this.opts.gate.open();
      return this.finish("pause", results, "; rolled back: the replicas that paused were resumed and the gate is open, nothing is paused");
    }
    return this.finish("pause", results);
  }

  /** Resumes every replica, then opens the gate. @throws EngineUnavailableError naming the replicas that failed (the gate is opened anyway) */
  async resume(): Promise<EngineStatus> {
    const sglang = this.opts.format === "sglang";
    const results = await this.fanOut((t) => this.resumeReplica(t));
    await this.opts.gate.open();
    return this.finish("resume", results, "; the gate is open (edgeloop sends calls again) but those replicas may still be paused: resume them by their own API or retry");
  }

  /** The gate's state, the calls in flight and each replica's `is_paused` (vLLM; null for SGLang, which does not say). */
  /** The deployment's pause gate alone (no replica is asked): paused or not, and the engine calls admitted through it now. What `/metrics` reports. */
  async gateStatus(): Promise<{ paused: boolean; inflight: number }> {
    const [st, inflight] = await Promise.all([this.opts.gate.state(), this.opts.gate.inflight()]);
    return { paused: st.paused, inflight };
  }

  async status(): Promise<EngineStatus> {
    const results = await this.fanOut(async (t) => {
      if (this.opts.format === "sglang") return { url: t.url, ok: true, status: 200, paused: null };
      const r = await this.call(t, "GET", "/is_paused");
      return r;
    });
    const [st, inflight] = await Promise.all([this.opts.gate.state(), this.opts.gate.inflight()]);
    return { ...st, inflight, replicas: results };
  }

  private async finish(what: string, results: ReplicaControlResult[], after = ""): Promise<EngineStatus> {
    const [st, inflight] = await Promise.all([this.opts.gate.state(), this.opts.gate.inflight()]);
    const failed = results.filter((r) => !r.ok);
    if (failed.length) {
      throw new EngineUnavailableError(`engine ${what} failed at ${failed.map((f) => `${f.url} (${f.error ?? `HTTP ${f.status}`})`).join(", ")}${after}`, { status: 502, code: "engine_control_failed" });
    }
    return { ...st, inflight, replicas: results };
  }

  /** vLLM `POST /resume`; SGLang `POST /continue_generation {}`. */
  private resumeReplica(t: EngineReplicaTarget): Promise<ReplicaControlResult> {
    return this.opts.format === "sglang" ? this.call(t, "POST", "/continue_generation", {}) : this.call(t, "POST", "/resume");
  }

  private fanOut(fn: (t: EngineReplicaTarget) => Promise<ReplicaControlResult>): Promise<ReplicaControlResult[]> {
    // Replica URLs are shown (status replies, 502 messages) without userinfo or query: they may hold credentials.
    return Promise.all(
      this.opts.replicas().map((t) =>
        fn(t)
          .catch((e) => ({ url: t.url, ok: false, status: 0, error: (e as Error)?.message ?? String(e) }))
          .then((r) => ({ ...r, url: redactUrl(r.url) })),
      ),
    );
  }

  private async call(t: EngineReplicaTarget, method: "GET" | "POST", path: string, body?: unknown): Promise<ReplicaControlResult> {
    const f: FetchLike = t.fetch ?? ((input, init) => fetch(input, init));
    const headers: Record<string, string> = t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {};
    if (body !== undefined) headers["content-type"] = "application/json";
    const res = await f(joinUrl(t.url, path), {
      method,
      headers,
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(this.opts.timeoutMs ?? 600_000),
      redirect: "manual",
    });
    // Control replies are small: read under 1 MiB; a 3xx (never followed) is a failed call.
    const text = await readTextCapped(res, 1024 * 1024, `engine control ${redactUrl(t.url)}`);
    const out: ReplicaControlResult = { url: t.url, ok: res.ok, status: res.status };
    if (!res.ok) out.error = `HTTP ${res.status}: ${text.slice(0, 200)}${res.status === 401 || res.status === 403 ? ` (${ENGINE_AUTH_HINT})` : ""}`;
    else if (path === "/is_paused") {
      try {
        const p = (JSON.parse(text) as { is_paused?: unknown }).is_paused;
        out.paused = typeof p === "boolean" ? p : null;
      } catch {
        out.paused = null;
      }
    }
    return out;
  }
}
