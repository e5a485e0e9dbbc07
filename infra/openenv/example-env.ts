import type { Server, ServerWebSocket } from "bun";

/**
 * The example OpenEnv environment: guess-the-number, served over OpenEnv's
 * protocol (meta-pytorch/OpenEnv `openenv-core` 0.2.3, commit 685de411) so
 * that `openenv_agent` (and OpenEnv's own `GenericEnvClient`) can play it.
 *
 * Episode: `reset` picks the target `seed % 100 + 1` (no seed: 42) in
 * 1…100 and allows `max_attempts` guesses (reset field, default 6). The
 * action is `{"message": "<text holding a number>"}` (extra keys refused, as
 * OpenEnv's `extra="forbid"` action models do). A wrong guess has reward
 * −0.1 and says "Higher." or "Lower."; the right one reward 1 and `done`;
 * running out of guesses is `done` with reward −0.1. Observation:
 * `{prompt, attempts_left, last_guess}`.
 */
export class GuessNumberEnv {
  private target = 42;
  private left = 6;
  private steps = 0;
  private episodeId: string | null = null;

  /** `POST /reset` / WS `reset`: `seed` (integer ≥ 0), `episode_id`, `max_attempts` (1…100). */
  reset(fields: Record<string, unknown>): StepResult {
    const seed = typeof fields.seed === "number" && Number.isInteger(fields.seed) && fields.seed >= 0 ? fields.seed : 41;
    this.target = (seed % 100) + 1;
    const max = fields.max_attempts;
    this.left = typeof max === "number" && Number.isInteger(max) && max >= 1 && max <= 100 ? max : 6;
    this.steps = 0;
    this.episodeId = typeof fields.episode_id === "string" ? fields.episode_id : null;
    return { observation: { prompt: `I picked a number between 1 and 100. You have ${this.left} guesses. Reply with one number.`, attempts_left: this.left, last_guess: null }, reward: null, done: false };
  }

  /**
   * `POST /step` / WS `step`.
   * @throws ActionValidationError for an action that is not `{message: string}` (HTTP 422, WS `VALIDATION_ERROR`).
   */
  step(action: Record<string, unknown>): StepResult {
    const extra = Object.keys(action).filter((k) => k !== "message" && k !== "metadata");
    if (extra.length) throw new ActionValidationError([{ type: "extra_forbidden", loc: [extra[0]!], msg: "Extra inputs are not permitted" }]);
    if (typeof action.message !== "string") throw new ActionValidationError([{ type: "string_type", loc: ["message"], msg: "Input should be a valid string" }]);
    this.steps++;
    const m = /-?\d+/.exec(action.message);
    const guess = m ? Number(m[0]) : null;
    this.left = Math.max(0, this.left - 1);
    if (guess === this.target) return { observation: { prompt: `Correct, it was ${this.target}!`, attempts_left: this.left, last_guess: guess }, reward: 1, done: true };
    const hint = guess === null ? "That is not a number." : guess < this.target ? "Higher." : "Lower.";
    const done = this.left === 0;
    const prompt = done ? `${hint} No guesses left; it was ${this.target}.` : `${hint} ${this.left} guesses left.`;
    return { observation: { prompt, attempts_left: this.left, last_guess: guess }, reward: -0.1, done };
  }

  /** `GET /state` / WS `state`. */
  state(): Record<string, unknown> {
    return { episode_id: this.episodeId, step_count: this.steps };
  }
}

/** A reset or step result (`StepResponse`). */
export interface StepResult {
  observation: Record<string, unknown>;
  reward: number | null;
  done: boolean;
}

/** An action the environment's action model refuses; `detail` is what the 422 carries. */
export class ActionValidationError extends Error {
  override name = "ActionValidationError";
  constructor(readonly detail: unknown[]) {
    super("Invalid action");
  }
}

/** A running example environment. */
export interface ExampleEnvServer {
  /** Base URL, e.g. `http://127.0.0.1:8124`: HTTP routes there, the WebSocket at `ws://…/ws`. */
  url: string;
  port: number;
  stop(): Promise<void>;
}

const json = (v: unknown, status = 200) => new Response(JSON.stringify(v), { status, headers: { "content-type": "application/json" } });

const ACTION_SCHEMA = { title: "GuessAction", type: "object", properties: { message: { type: "string" }, metadata: { type: "object" } }, required: ["message"], additionalProperties: false };
const OBSERVATION_SCHEMA = { title: "GuessObservation", type: "object", properties: { prompt: { type: "string" }, attempts_left: { type: "integer" }, last_guess: { type: ["integer", "null"] } } };

/**
 * OpenEnv's HTTP routes over one environment (`env`), `pathname` relative to
 * the environment's base URL: `POST /reset`, `POST /step` (`{"action": {...}}`;
 * 422 with OpenEnv's `detail` for a bad body or action), `GET /state`,
 * `GET /health`, `GET /schema`, `GET /metadata`; anything else a JSON 404.
 * Used by {@link startExampleEnv} and by the example sandbox provider's
 * per-sandbox environments (`/envs/{sandbox_id}/…`).
 */
export async function exampleEnvHttp(httpEnv: GuessNumberEnv, req: Request, pathname: string): Promise<Response> {
  if (req.method === "GET") {
    if (pathname === "/health") return json({ status: "healthy" });
    if (pathname === "/state") return json(httpEnv.state());
    if (pathname === "/schema") return json({ action: ACTION_SCHEMA, observation: OBSERVATION_SCHEMA, state: { type: "object" } });
    if (pathname === "/metadata") return json({ name: "guess_number", description: "Guess a number between 1 and 100 (edgeloop's example OpenEnv environment)." });
    return json({ detail: "Not Found" }, 404);
  }
  if (req.method !== "POST" || (pathname !== "/reset" && pathname !== "/step")) return json({ detail: "Not Found" }, 404);
  const text = await req.text();
  let body: unknown = {};
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      return json({ detail: [{ type: "json_invalid", loc: ["body"], msg: "JSON decode error" }] }, 422);
    }
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) return json({ detail: [{ type: "model_attributes_type", loc: ["body"], msg: "Input should be a valid dictionary" }] }, 422);
  const b = body as Record<string, unknown>;
  if (pathname === "/reset") return json(httpEnv.reset(b));
  if (typeof b.action !== "object" || b.action === null || Array.isArray(b.action)) return json({ detail: [{ type: "missing", loc: ["body", "action"], msg: "Field required" }] }, 422);
  try {
    return json(httpEnv.step(b.action as Record<string, unknown>));
  } catch (e) {
    if (e instanceof ActionValidationError) return json({ detail: e.detail }, 422);
    throw e;
  }
}

interface Conn {
  env: GuessNumberEnv;
}

/**
 * Starts the example environment with `Bun.serve` (`port: 0`, the default,
 * picks a free one). Routes, as OpenEnv's server has them: `POST /reset`,
 * `POST /step` (`{"action": {...}}`), `GET /state`, `GET /health`,
 * `GET /schema`, `GET /metadata`, and `WS /ws` (one environment per
 * connection: `reset`/`step`/`state`/`close` messages). The HTTP routes share
 * one environment (one episode at a time: run HTTP episodes one after the
 * other, or use the WebSocket for concurrent ones).
 */
export function startExampleEnv(opts: { port?: number; hostname?: string } = {}): ExampleEnvServer {
  const hostname = opts.hostname ?? "127.0.0.1";
  const httpEnv = new GuessNumberEnv();
  const server: Server<Conn> = Bun.serve<Conn>({
    hostname,
    port: opts.port ?? 0,
    async fetch(req, srv) {
      const { pathname } = new URL(req.url);
      if (pathname === "/ws") {
        if (srv.upgrade(req, { data: { env: new GuessNumberEnv() } })) return undefined;
        return new Response("expected a WebSocket upgrade", { status: 426 });
      }
      return exampleEnvHttp(httpEnv, req, pathname);
    },
    websocket: {
      message(ws: ServerWebSocket<Conn>, raw) {
        const send = (v: unknown): void => {
          ws.send(JSON.stringify(v));
        };
        let msg: { type?: unknown; data?: unknown };
        try {
          msg = JSON.parse(String(raw));
        } catch (e) {
          send({ type: "error", data: { message: `Invalid JSON: ${(e as Error).message}`, code: "INVALID_JSON" } });
          return;
        }
        const data = (msg.data ?? {}) as Record<string, unknown>;
        try {
          if (msg.type === "reset") send({ type: "observation", data: ws.data.env.reset(data) });
          else if (msg.type === "step") send({ type: "observation", data: ws.data.env.step(data) });
          else if (msg.type === "state") send({ type: "state", data: ws.data.env.state() });
          else if (msg.type === "close") ws.close();
          else send({ type: "error", data: { message: `Unknown message type: ${String(msg.type ?? "")}`, code: "UNKNOWN_TYPE" } });
        } catch (e) {
          if (e instanceof ActionValidationError) send({ type: "error", data: { message: "Invalid message", code: "VALIDATION_ERROR", errors: e.detail } });
          else send({ type: "error", data: { message: String(e), code: "EXECUTION_ERROR" } });
        }
      },
    },
  });
  const port = server.port!;
  return {
    url: `http://${hostname}:${port}`,
    port,
    stop: async () => {
      await server.stop(true);
    },
  };
}
