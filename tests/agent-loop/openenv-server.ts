/**
 * An OpenEnv-protocol server for the `openenv_agent` tests, written from
 * OpenEnv's documentation and server source (meta-pytorch/OpenEnv
 * `openenv-core` 0.2.3, commit 685de411: `env_server/http_server.py`,
 * `env_server/types.py`, `env_client.py`), as strict as it:
 *
 * - `POST /reset` (body optional; `seed` an integer ≥ 0, `episode_id` a
 *   string of ≤ 255 characters, extra keys allowed) → `{observation, reward, done}`;
 * - `POST /step` `{"action": {...}, "timeout_s"?, "request_id"?}` → the same
 *   shape; a body without an `action` object, or an action the environment's
 *   action model refuses (`extra="forbid"`), is a 422 with `detail`;
 * - `GET /state`, `GET /health`;
 * - `WS /ws`: one environment per connection; `{"type":"reset","data":{…}}`,
 *   `{"type":"step","data":<action>}`, `{"type":"state"}`, `{"type":"close"}`
 *   (messages with other keys are refused, `extra="forbid"`), answered by
 *   `{"type":"observation","data":…}` / `{"type":"state","data":…}` /
 *   `{"type":"error","data":{message, code}}` (`INVALID_JSON`,
 *   `UNKNOWN_TYPE`, `VALIDATION_ERROR`, `EXECUTION_ERROR`).
 *
 * The HTTP form here keeps one environment per server (OpenEnv's own HTTP
 * routes make a fresh environment per request; multi-step HTTP episodes need
 * a server that keeps one, as this one does).
 *
 * The environment is guess-the-number: the target is `seed % 10 + 1`
 * (seed default 6, so 7), `max_attempts` guesses (default 3); a wrong guess
 * has reward −0.25 and says "Higher." or "Lower.", the right one reward 1
 * and `done`; running out of attempts is `done` (with `truncated: true` when
 * `gymFlags`).
 */
import type { Server, ServerWebSocket } from "bun";

export interface GuessObservation {
  prompt: string;
  attempts_left: number;
  [k: string]: unknown;
}

/** What a reset or step answers (`StepResponse`). */
export interface EnvResult {
  observation: Record<string, unknown>;
  reward: number | null;
  done: boolean;
  terminated?: boolean;
  truncated?: boolean;
}

class GuessEnv {
  target = 7;
  left = 3;
  steps = 0;
  episodeId: string | null = null;
  constructor(private readonly opts: ServerOptions) {}

  reset(fields: Record<string, unknown>): EnvResult {
    const seed = typeof fields.seed === "number" ? fields.seed : 6;
    this.target = (seed % 10) + 1;
    this.left = this.opts.maxAttempts ?? 3;
    this.steps = 0;
    this.episodeId = typeof fields.episode_id === "string" ? fields.episode_id : null;
    return { observation: { prompt: "Guess the number (1-10).", attempts_left: this.left }, reward: null, done: this.opts.doneAtReset ?? false };
  }

  /** @throws ActionError for an action the action model refuses. */
  step(action: Record<string, unknown>): EnvResult {
    const extra = Object.keys(action).filter((k) => k !== "message" && k !== "metadata");
    if (extra.length) throw new ActionError([{ type: "extra_forbidden", loc: [extra[0]!], msg: "Extra inputs are not permitted" }]);
    if (typeof action.message !== "string") throw new ActionError([{ type: "string_type", loc: ["message"], msg: "Input should be a valid string" }]);
    this.steps++;
    const m = /\d+/.exec(action.message);
    const guess = m ? Number(m[0]) : NaN;
    this.left--;
    if (guess === this.target) return { observation: { prompt: "Correct!", attempts_left: this.left }, reward: 1, done: true, ...(this.opts.gymFlags ? { terminated: true, truncated: false } : {}) };
    const prompt = Number.isNaN(guess) ? "Say a number." : guess < this.target ? "Higher." : "Lower.";
    const out = this.left <= 0;
    return { observation: { prompt, attempts_left: this.left }, reward: -0.25, done: out, ...(this.opts.gymFlags ? { terminated: false, truncated: out } : {}) };
  }

  state(): Record<string, unknown> {
    return { episode_id: this.episodeId, step_count: this.steps };
  }
}

class ActionError extends Error {
  constructor(readonly detail: unknown[]) {
    super("validation error");
  }
}

export interface ServerOptions {
  maxAttempts?: number;
  doneAtReset?: boolean;
  gymFlags?: boolean;
  /** HTTP: answer every step with this status (and body `{"detail": "boom"}`). */
  stepStatus?: number;
  /** HTTP: answer every step with this raw body (status 200). */
  stepBody?: string;
  /** Never answer a step (HTTP and WebSocket). */
  hangStep?: boolean;
  /** WebSocket: answer every step with an `EXECUTION_ERROR` message. */
  wsStepError?: boolean;
  /** WebSocket: answer every step twice (a second, unasked-for observation message). */
  wsDoubleReply?: boolean;
  /** Every step's reward is this (a finite number whose sum can overflow, e.g. 1.7e308). */
  stepReward?: number;
}

/** What the server saw, in order. */
export interface ServerLog {
  /** HTTP requests: method, path, parsed body. */
  http: Array<{ method: string; path: string; body: unknown }>;
  /** WebSocket messages received (parsed), per connection index. */
  ws: Array<{ conn: number; msg: unknown }>;
  wsOpened: number;
  wsClosed: number;
}

export interface OpenEnvTestServer {
  url: string;
  log: ServerLog;
  /** Steps executed (both forms). */
  steps(): number;
  /** Resolves once `pred(log)` holds (checked after every request and message). */
  until(pred: (log: ServerLog) => boolean): Promise<void>;
  stop(): Promise<void>;
}

interface WsData {
  conn: number;
  env: GuessEnv;
}

/** Starts the server on a free loopback port. */
export function startOpenEnvServer(opts: ServerOptions = {}): OpenEnvTestServer {
  const log: ServerLog = { http: [], ws: [], wsOpened: 0, wsClosed: 0 };
  const waiters: Array<{ pred: (l: ServerLog) => boolean; resolve(): void }> = [];
  const notify = () => {
    for (let i = waiters.length - 1; i >= 0; i--) {
      if (waiters[i]!.pred(log)) {
        waiters[i]!.resolve();
        waiters.splice(i, 1);
      }
    }
  };
  const httpEnv = new GuessEnv(opts);
  let steps = 0;
  let conns = 0;
  const json = (v: unknown, status = 200) => new Response(JSON.stringify(v), { status, headers: { "content-type": "application/json" } });
  const hang = () => new Promise<Response>(() => undefined);

  const server: Server<WsData> = Bun.serve<WsData>({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req, srv) {
      const url = new URL(req.url);
      if (url.pathname === "/ws") {
        if (srv.upgrade(req, { data: { conn: conns++, env: new GuessEnv(opts) } })) return undefined;
        return new Response("expected a WebSocket upgrade", { status: 426 });
      }
      let body: unknown = undefined;
      if (req.method === "POST") {
        const text = await req.text();
        if (text) {
          try {
            body = JSON.parse(text);
          } catch {
            return json({ detail: [{ type: "json_invalid", loc: ["body", 0], msg: "JSON decode error" }] }, 422);
          }
        }
      }
      log.http.push({ method: req.method, path: url.pathname, body });
      notify();
      if (req.method === "GET" && url.pathname === "/health") return json({ status: "healthy" });
      if (req.method === "GET" && url.pathname === "/state") return json(httpEnv.state());
      if (req.method === "POST" && url.pathname === "/reset") {
        const fields = (body ?? {}) as Record<string, unknown>;
        if (typeof fields !== "object" || Array.isArray(fields)) return json({ detail: [{ type: "model_attributes_type", loc: ["body"], msg: "Input should be a valid dictionary" }] }, 422);
        if (fields.seed != null && !(Number.isInteger(fields.seed) && (fields.seed as number) >= 0)) return json({ detail: [{ type: "greater_than_equal", loc: ["body", "seed"], msg: "Input should be greater than or equal to 0" }] }, 422);
        if (fields.episode_id != null && !(typeof fields.episode_id === "string" && fields.episode_id.length <= 255)) return json({ detail: [{ type: "string_too_long", loc: ["body", "episode_id"], msg: "String should have at most 255 characters" }] }, 422);
        return json(httpEnv.reset(fields));
      }
      if (req.method === "POST" && url.pathname === "/step") {
        const b = body as { action?: unknown; request_id?: unknown } | undefined;
        if (!b || typeof b.action !== "object" || b.action === null || Array.isArray(b.action)) return json({ detail: [{ type: "missing", loc: ["body", "action"], msg: "Field required" }] }, 422);
        if (b.request_id != null && !(typeof b.request_id === "string" && b.request_id.length <= 255)) return json({ detail: [{ type: "string_too_long", loc: ["body", "request_id"], msg: "String should have at most 255 characters" }] }, 422);
        if (opts.hangStep) return hang();
        if (opts.stepStatus) return json({ detail: "boom" }, opts.stepStatus);
        if (opts.stepBody !== undefined) return new Response(opts.stepBody, { headers: { "content-type": "application/json" } });
        try {
          const r = httpEnv.step(b.action as Record<string, unknown>);
          steps++;
          return json(r);
        } catch (e) {
          if (e instanceof ActionError) return json({ detail: e.detail }, 422);
          throw e;
        }
      }
      return json({ detail: "Not Found" }, 404);
    },
    websocket: {
      open() {
        log.wsOpened++;
        notify();
      },
      message(ws: ServerWebSocket<WsData>, raw) {
        const send = (v: unknown): void => {
          ws.send(JSON.stringify(v));
        };
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(String(raw));
        } catch (e) {
          send({ type: "error", data: { message: `Invalid JSON: ${(e as Error).message}`, code: "INVALID_JSON" } });
          return;
        }
        log.ws.push({ conn: ws.data.conn, msg });
        notify();
        const env = ws.data.env;
        const extra = Object.keys(msg).filter((k) => k !== "type" && k !== "data");
        const invalid = (): void => send({ type: "error", data: { message: "Invalid message", code: "VALIDATION_ERROR", errors: [{ type: "extra_forbidden", loc: [extra[0]] }] } });
        switch (msg.type) {
          case "reset": {
            if (extra.length) return invalid();
            send({ type: "observation", data: env.reset((msg.data ?? {}) as Record<string, unknown>) });
            return;
          }
          case "step": {
            if (extra.length || typeof msg.data !== "object" || msg.data === null) return invalid();
            if (opts.hangStep) return;
            if (opts.wsStepError) {
              send({ type: "error", data: { message: "the environment crashed", code: "EXECUTION_ERROR" } });
              return;
            }
            try {
              const r = env.step(msg.data as Record<string, unknown>);
              if (opts.stepReward !== undefined) r.reward = opts.stepReward;
              steps++;
              send({ type: "observation", data: r });
              if (opts.wsDoubleReply) send({ type: "observation", data: { ...r, observation: { ...r.observation, prompt: "a second reply" } } });
            } catch (e) {
              if (e instanceof ActionError) send({ type: "error", data: { message: "Invalid message", code: "VALIDATION_ERROR", errors: e.detail } });
              else send({ type: "error", data: { message: String(e), code: "EXECUTION_ERROR" } });
            }
            return;
          }
          case "state":
            if (extra.length) return invalid();
            send({ type: "state", data: env.state() });
            return;
          case "close":
            ws.close();
            return;
          default:
            send({ type: "error", data: { message: `Unknown message type: ${String(msg.type ?? "")}`, code: "UNKNOWN_TYPE" } });
        }
      },
      close() {
        log.wsClosed++;
        notify();
      },
    },
  });

  return {
    url: `http://127.0.0.1:${server.port}`,
    log,
    steps: () => steps,
    until(pred) {
      if (pred(log)) return Promise.resolve();
      return new Promise<void>((resolve) => waiters.push({ pred, resolve }));
    },
    async stop() {
      await server.stop(true);
    },
  };
}
