import { EdgeloopError } from "../errors.ts";
import { OutboundHttpError, outboundRequest, redactUrl, type OutboundFetch } from "../http/outbound.ts";
import { OpenEnvResult, type OpenEnvTransport } from "../schema/openenv.ts";

/**
 * A client of one OpenEnv environment episode, over HTTP or WebSocket, as
 * OpenEnv's server speaks it (meta-pytorch/OpenEnv `openenv-core` 0.2.3,
 * commit 685de411, `src/openenv/core/env_server/http_server.py` and `types.py`):
 *
 * - HTTP: `POST {base}/reset` with the reset fields (`seed`, `episode_id`, extra
 *   keys) → `{observation, reward, done}`; `POST {base}/step` with
 *   `{"action": {...}, "request_id"?}` → the same shape; 422 for an action the
 *   environment refuses.
 * - WebSocket `{ws base}/ws` (http→ws, https→wss): one environment per
 *   connection; the client sends `{"type":"reset","data":{…}}`,
 *   `{"type":"step","data":<action>}`, `{"type":"close"}`; the server answers
 *   each with `{"type":"observation","data":{observation, reward, done}}` or
 *   `{"type":"error","data":{message, code}}`.
 *
 * Runtime-free: HTTP through the bounded outbound helper (no redirects, a
 * deadline, a byte cap); WebSocket through the standard `WebSocket` class
 * (Bun, Deno, Workers, browsers), injected or the global one.
 */

/** An environment call failed (connection, HTTP status, timeout, bad JSON, a server `error` message): the trajectory fails with it. Names the environment's URL (redacted). */
export class OpenEnvError extends EdgeloopError {
  override name = "OpenEnvError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, opts: { cause?: unknown; code?: string } = {}) {
    super(message, { status: 502, code: opts.code ?? "openenv_error", ...(opts.cause !== undefined ? { cause: opts.cause } : {}) });
  }
}

/** The part of the standard `WebSocket` the client uses (so any implementation of the standard fits). */
export interface OpenEnvSocket {
  readonly readyState: number;
  binaryType?: string;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: "open" | "message" | "error" | "close", listener: (ev: { data?: unknown; code?: number; reason?: string; message?: string }) => void): void;
}

/** Makes a WebSocket to a `ws(s)://` URL (default: `new globalThis.WebSocket(url)`). */
export type OpenEnvSocketFactory = (url: string) => OpenEnvSocket;

/** One episode's environment: reset once, step per action, close at the end (idempotent). */
export interface OpenEnvEpisode {
  /** The URL messages name (redacted). */
  readonly what: string;
  reset(fields: Record<string, unknown>, signal?: AbortSignal): Promise<OpenEnvResult>;
  /** One step; `requestId` (`{key}:{turn}`) is sent over HTTP as `request_id` (OpenEnv's optional tracking id). */
  step(action: Record<string, unknown>, requestId: string, signal?: AbortSignal): Promise<OpenEnvResult>;
  close(): void;
}

/** Options of {@link openEpisode}. */
export interface OpenEnvClientOptions {
  transport: OpenEnvTransport;
  /** Deadline of one call (connect, reset, step), ms. */
  timeoutMs: number;
  /** Cap of one reply, bytes. */
  maxBytes: number;
  fetch?: OutboundFetch;
  webSocket?: OpenEnvSocketFactory;
}

/** `base` as an HTTP base URL (ws→http, wss→https), without a trailing slash. */
export function httpBaseOf(base: string): string {
  const b = base.replace(/\/+$/, "");
  if (b.startsWith("ws://")) return `http://${b.slice(5)}`;
  if (b.startsWith("wss://")) return `https://${b.slice(6)}`;
  return b;
}

/** The WebSocket endpoint of `base`, as OpenEnv's client derives it: http→ws, https→wss, then `/ws`. */
export function wsUrlOf(base: string): string {
  const b = base.replace(/\/+$/, "");
  if (b.startsWith("http://")) return `ws://${b.slice(7)}/ws`;
  if (b.startsWith("https://")) return `wss://${b.slice(8)}/ws`;
  return `${b}/ws`;
}

/**
 * An episode's client for the environment at `base`. HTTP opens nothing;
 * WebSocket connects on the first call.
 */
export function openEpisode(base: string, opts: OpenEnvClientOptions): OpenEnvEpisode {
  return opts.transport === "http" ? new HttpEpisode(httpBaseOf(base), opts) : new WsEpisode(wsUrlOf(base), opts);
}

/** Parses a reset/step result; `what` names the call in the error. */
function parseResult(text: string, what: string): OpenEnvResult {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new OpenEnvError(`${what}: reply is not JSON: ${snippet(text)}`, { code: "openenv_bad_reply" });
  }
  return checkResult(json, what);
}

/** Checks a reset/step result's shape ({@link OpenEnvResult}). */
function checkResult(json: unknown, what: string): OpenEnvResult {
  const r = OpenEnvResult.safeParse(json);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new OpenEnvError(`${what}: reply ${i.path.length ? i.path.join(".") : "(root)"}: ${i.message}`, { code: "openenv_bad_reply" });
  }
  return r.data;
}

function snippet(s: string): string {
  const t = s.replace(/\s+/g, " ").trim();
  return JSON.stringify(t.length > 200 ? `${t.slice(0, 200)}…` : t);
}

/**
 * HTTP episodes open in this process, per environment base URL. OpenEnv's HTTP form has no episode id (a `step` acts
 * on the server's one current episode), so a second reset on the same server while an episode runs would restart the
 * first trajectory's game under it: both records would be wrong, silently (the fresh-user trial: 12 of 12 "won on the
 * first guess"). The second one fails instead, naming the fix. Other processes (workers) cannot be seen from here.
 */
const runningHttpEpisodes = new Map<string, number>();

class HttpEpisode implements OpenEnvEpisode {
  readonly what: string;
  private registered = false;
  constructor(
    private readonly base: string,
    private readonly opts: OpenEnvClientOptions,
  ) {
    this.what = `openenv ${redactUrl(base)}`;
  }

  reset(fields: Record<string, unknown>, signal?: AbortSignal): Promise<OpenEnvResult> {
    if (!this.registered) {
      const n = runningHttpEpisodes.get(this.base) ?? 0;
      if (n > 0) {
        return Promise.reject(
          new OpenEnvError(
            `${this.what}: another trajectory's episode is running on this server; OpenEnv's HTTP form keeps one episode per server (a step names no episode), so two at once would play each other's game: use transport websocket (one episode per connection), one server per trajectory (extra_info.openenv.base_url), or --concurrency 1`,
            { code: "openenv_episode_busy" },
          ),
        );
      }
      runningHttpEpisodes.set(this.base, n + 1);
      this.registered = true;
    }
    return this.post("/reset", fields, signal);
  }

  step(action: Record<string, unknown>, requestId: string, signal?: AbortSignal): Promise<OpenEnvResult> {
    return this.post("/step", { action, ...(requestId.length <= 255 ? { request_id: requestId } : {}) }, signal);
  }

  close(): void {
    if (!this.registered) return;
    this.registered = false;
    const n = (runningHttpEpisodes.get(this.base) ?? 1) - 1;
    if (n > 0) runningHttpEpisodes.set(this.base, n);
    else runningHttpEpisodes.delete(this.base);
  }

  private async post(path: string, body: unknown, signal?: AbortSignal): Promise<OpenEnvResult> {
    const what = `${this.what} POST ${path}`;
    let reply;
    try {
      reply = await outboundRequest(`${this.base}${path}`, {
        headers: { "content-type": "application/json", accept: "application/json" },
        body: JSON.stringify(body),
        timeoutMs: this.opts.timeoutMs,
        maxReplyBytes: this.opts.maxBytes,
        ...(signal ? { signal } : {}),
        ...(this.opts.fetch ? { fetch: this.opts.fetch } : {}),
        what,
      });
    } catch (e) {
      if (e instanceof OutboundHttpError) throw new OpenEnvError(e.message, { cause: e, code: e.kind === "timeout" ? "openenv_timeout" : "openenv_error" });
      throw e;
    }
    if (reply.status < 200 || reply.status >= 300) throw new OpenEnvError(`${what}: answered HTTP ${reply.status}: ${snippet(reply.text)}`, { code: "openenv_status" });
    return parseResult(reply.text, what);
  }
}

/** WebSocket `readyState` values of the standard. */
const OPEN = 1;

class WsEpisode implements OpenEnvEpisode {
  readonly what: string;
  private socket: OpenEnvSocket | null = null;
  private connecting: Promise<OpenEnvSocket> | null = null;
  private waiter: { resolve(text: string): void; reject(e: Error): void } | null = null;
  /** Why the connection is unusable (closed, errored, a reply over the cap); every later call fails with it. */
  private broken: OpenEnvError | null = null;
  private closed = false;

  constructor(
    private readonly url: string,
    private readonly opts: OpenEnvClientOptions,
  ) {
    this.what = `openenv ${redactUrl(url)}`;
  }

  async reset(fields: Record<string, unknown>, signal?: AbortSignal): Promise<OpenEnvResult> {
    return this.request({ type: "reset", data: fields }, "reset", signal);
  }

  async step(action: Record<string, unknown>, _requestId: string, signal?: AbortSignal): Promise<OpenEnvResult> {
    return this.request({ type: "step", data: action }, "step", signal);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    const s = this.socket;
    this.fail(new OpenEnvError(`${this.what}: closed`));
    if (!s) return;
    try {
      if (s.readyState === OPEN) s.send(JSON.stringify({ type: "close" }));
      s.close(1000, "episode finished");
    } catch {
      // Closing a socket that is already going away: nothing to do.
    }
  }

  private fail(e: OpenEnvError): void {
    this.broken ??= e;
    const w = this.waiter;
    this.waiter = null;
    w?.reject(this.broken);
  }

  private connect(signal?: AbortSignal): Promise<OpenEnvSocket> {
    if (this.socket) return Promise.resolve(this.socket);
    this.connecting ??= new Promise<OpenEnvSocket>((resolve, reject) => {
      const make = this.opts.webSocket ?? defaultSocketFactory(this.what);
      let s: OpenEnvSocket;
      try {
        s = make(this.url);
      } catch (e) {
        reject(new OpenEnvError(`${this.what}: cannot open a WebSocket: ${(e as Error).message ?? String(e)}`, { cause: e }));
        return;
      }
      s.binaryType = "arraybuffer";
      let opened = false;
      const timer = setTimeout(() => {
        if (opened) return;
        this.fail(new OpenEnvError(`${this.what}: WebSocket not open within ${this.opts.timeoutMs} ms`, { code: "openenv_timeout" }));
        reject(this.broken);
        try {
          s.close();
        } catch {
          // Already failing.
        }
      }, this.opts.timeoutMs);
      const onAbort = () => {
        clearTimeout(timer);
        this.fail(new OpenEnvError(`${this.what}: aborted`, { code: "openenv_aborted" }));
        reject(this.broken);
        try {
          s.close();
        } catch {
          // Already failing.
        }
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      s.addEventListener("open", () => {
        opened = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.socket = s;
        resolve(s);
      });
      s.addEventListener("message", (ev) => this.onMessage(ev.data));
      s.addEventListener("error", (ev) => {
        this.fail(new OpenEnvError(`${this.what}: WebSocket error${ev.message ? `: ${ev.message}` : ""}`));
        if (!opened) {
          clearTimeout(timer);
          reject(this.broken);
        }
      });
      s.addEventListener("close", (ev) => {
        this.fail(new OpenEnvError(`${this.what}: connection closed${ev.code ? ` (code ${ev.code}${ev.reason ? `, ${ev.reason}` : ""})` : ""}`));
        if (!opened) {
          clearTimeout(timer);
          reject(this.broken);
        }
      });
    });
    return this.connecting;
  }

  private onMessage(data: unknown): void {
    let text: string;
    if (typeof data === "string") text = data;
    else if (data instanceof ArrayBuffer) text = new TextDecoder().decode(data);
    else if (ArrayBuffer.isView(data)) text = new TextDecoder().decode(data);
    else {
      this.fail(new OpenEnvError(`${this.what}: a message that is neither text nor bytes`, { code: "openenv_bad_reply" }));
      return;
    }
    // Characters ≤ UTF-8 bytes ≤ 3 × characters: the exact count only when it can matter.
    const max = this.opts.maxBytes;
    if (text.length > max || (text.length * 3 > max && new TextEncoder().encode(text).length > max)) {
      this.fail(new OpenEnvError(`${this.what}: message larger than ${max} bytes (the cap)`, { code: "openenv_too_large" }));
      this.socket?.close(1009, "message too big");
      return;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w.resolve(text);
      return;
    }
    // The protocol answers each message with exactly one: a message no request asked for (a second reply, a late one)
    // would be read as the next step's reply, one step out of sync. The episode is unusable from here.
    this.fail(new OpenEnvError(`${this.what}: sent a message no request asked for (the protocol answers each message with one): ${snippet(text)}`, { code: "openenv_bad_reply" }));
    this.close();
  }

  private async request(msg: { type: string; data: unknown }, call: string, signal?: AbortSignal): Promise<OpenEnvResult> {
    const what = `${this.what} ${call}`;
    if (this.broken) throw this.broken;
    const s = await this.connect(signal);
    // Let messages already received be dispatched first (one macrotask): an extra reply to the previous request that
    // is in hand is then seen as unasked-for, not read as this request's reply. The protocol's messages carry no
    // request id, so an extra message arriving only after this request is sent cannot be told from its reply.
    await new Promise<void>((r) => setTimeout(r, 0));
    if (this.broken) throw this.broken;
    // One request at a time: the protocol answers each message with one message, in order.
    const reply = new Promise<string>((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
    try {
      s.send(JSON.stringify(msg));
    } catch (e) {
      this.waiter = null;
      throw new OpenEnvError(`${what}: send failed: ${(e as Error).message ?? String(e)}`, { cause: e });
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    const stop = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new OpenEnvError(`${what}: no reply within ${this.opts.timeoutMs} ms`, { code: "openenv_timeout" })), this.opts.timeoutMs);
      if (signal) {
        onAbort = () => reject(new OpenEnvError(`${what}: aborted`, { code: "openenv_aborted" }));
        if (signal.aborted) onAbort();
        else signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    let text: string;
    try {
      text = await Promise.race([reply, stop]);
    } catch (e) {
      // A late reply would answer the next request: the connection is not usable any more.
      this.fail(e as OpenEnvError);
      this.close();
      throw e;
    } finally {
      clearTimeout(timer);
      if (onAbort) signal?.removeEventListener("abort", onAbort);
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new OpenEnvError(`${what}: message is not JSON: ${snippet(text)}`, { code: "openenv_bad_reply" });
    }
    const m = json as { type?: unknown; data?: unknown } | null;
    if (m && typeof m === "object" && m.type === "error") {
      const d = (m.data ?? {}) as { message?: unknown; code?: unknown };
      throw new OpenEnvError(`${what}: server error: ${typeof d.message === "string" ? d.message : "unknown error"} (code ${typeof d.code === "string" ? d.code : "UNKNOWN"})`, { code: "openenv_server_error" });
    }
    if (!m || typeof m !== "object" || m.type !== "observation") {
      throw new OpenEnvError(`${what}: expected a message of type 'observation', got ${snippet(text)}`, { code: "openenv_bad_reply" });
    }
    return checkResult(m.data ?? null, what);
  }
}

function defaultSocketFactory(what: string): OpenEnvSocketFactory {
  const W = (globalThis as { WebSocket?: new (url: string) => OpenEnvSocket }).WebSocket;
  if (typeof W !== "function") throw new OpenEnvError(`${what}: this runtime has no global WebSocket; use openenv.transport: http or inject one`);
  return (url) => new W(url);
}
