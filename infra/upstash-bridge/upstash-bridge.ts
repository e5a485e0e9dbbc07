import IORedis from "ioredis";
import { maskRedisUrl } from "../redis/redis-check.ts";
import { listen } from "../cli/listen.ts";

/** Options of {@link startUpstashBridge}. */
export interface UpstashBridgeOptions {
  /** TCP port to listen on; 0 picks a free one. */
  port: number;
  /** Interface to bind (default `127.0.0.1`). */
  hostname?: string;
  /** The Redis behind the bridge, e.g. `redis://127.0.0.1:6379`. */
  redisUrl: string;
  /** Bearer token clients must send (`Authorization: Bearer <token>`). */
  token: string;
  /** Largest request body accepted, bytes (default {@link DEFAULT_BRIDGE_MAX_BODY}); larger ones are 413 `{"error"}`. */
  maxBodyBytes?: number;
}

/** Default body limit of the bridge: 16 MiB (pipelines of large records fit; Upstash's own limit depends on the plan). */
export const DEFAULT_BRIDGE_MAX_BODY = 16 * 1024 * 1024;

/** A running bridge. */
export interface UpstashBridge {
  /** Base URL to give `@upstash/redis` (`http://127.0.0.1:<port>`). */
  url: string;
  port: number;
  /** Stops the server and closes the Redis connections. */
  stop(): Promise<void>;
}

type Json = string | number | boolean;
type Reply = Buffer | number | null | Reply[] | Error;

/** Commands that change connection state or never return; the bridge shares connections, so it refuses them. */
const REFUSED = new Set(["SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "MONITOR", "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH", "SELECT", "QUIT", "RESET", "HELLO", "AUTH", "CLIENT", "SYNC", "PSYNC"]);
const BLOCKING = new Set(["BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP", "WAIT", "WAITAOF"]);

class BadRequest extends Error {}

/** A body over the limit (413). */
class TooLarge extends Error {}

/**
 * Reads a request body of at most `max` bytes: refused by `content-length`
 * when declared, else while it streams in (never buffering more than `max`).
 * @throws TooLarge
 */
async function readLimited(req: Request, max: number): Promise<string> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > max) throw new TooLarge();
  if (!req.body) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = req.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      await reader.cancel().catch(() => {});
      throw new TooLarge();
    }
    chunks.push(value);
  }
  return new TextDecoder().decode(Buffer.concat(chunks));
}

function isBlocking(cmd: string[]): boolean {
  const name = cmd[0]!.toUpperCase();
  if (BLOCKING.has(name)) return true;
  return (name === "XREAD" || name === "XREADGROUP") && cmd.some((a) => a.toUpperCase() === "BLOCK");
}

function parseCommand(v: unknown): string[] {
  if (!Array.isArray(v) || v.length === 0) throw new BadRequest("ERR a command must be a non-empty JSON array");
  return v.map((a: unknown) => {
    if (typeof a === "string") return a;
    if (typeof a === "number" || typeof a === "boolean") return String(a as Json);
    throw new BadRequest("ERR command arguments must be strings, numbers or booleans");
  });
}

/** One reply in the JSON shape: strings base64 (except "OK") when asked, integers and null as is. */
function encodeReply(r: Reply, base64: boolean): unknown {
  if (r === null || typeof r === "number") return r;
  if (r instanceof Error) return { error: r.message };
  if (Array.isArray(r)) return r.map((x) => encodeReply(x, base64));
  if (Buffer.isBuffer(r)) {
    if (!base64) return r.toString("utf8");
    return r.length === 2 && r[0] === 0x4f && r[1] === 0x4b ? "OK" : r.toString("base64");
  }
  return String(r);
}

function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

/**
 * Starts a server speaking the Upstash Redis REST protocol over a local Redis,
 * so the Upstash adapter can be tested against real Redis:
 * `POST /` with a JSON command array → `{"result": …}` (Redis error → 400
 * `{"error": "…"}`); `POST /pipeline` with an array of commands → an array of
 * `{result}`/`{error}` items (HTTP 200); `POST /multi-exec` → the same inside
 * MULTI/EXEC, or 400 `{"error"}` when the transaction is discarded. Bearer
 * auth (401 `{"error":"Unauthorized"}` otherwise), `Upstash-Encoding: base64`
 * (every string result base64 except the literal `"OK"`, recursively; integers
 * and null untouched). Blocking commands run on a connection of their own.
 * Bodies over `maxBodyBytes` are 413 `{"error"}` (checked after auth).
 * Bun only (Bun.serve).
 * @see https://upstash.com/docs/redis/features/restapi
 */
export async function startUpstashBridge(opts: UpstashBridgeOptions): Promise<UpstashBridge> {
  // Connection errors are answered per request (500 {"error"}); the events themselves are reported once
  // per outage instead of ioredis's "Unhandled error event" stack trace on every reconnect attempt.
  const watch = (c: IORedis) => {
    let failing = false;
    c.on("error", (e: Error) => {
      if (!failing) console.error(`edgeloop upstash-bridge: Redis ${maskRedisUrl(opts.redisUrl)}: ${e.message} (reconnecting)`);
      failing = true;
    });
    c.on("ready", () => (failing = false));
    return c;
  };
  const main = watch(new IORedis(opts.redisUrl, { maxRetriesPerRequest: 2, retryStrategy: (times) => Math.min(times * 200, 5_000) }));
  const idle: IORedis[] = [];
  const all = new Set<IORedis>([main]);
  await main.ping();
  const expected = `Bearer ${opts.token}`;

  async function withBlocking<T>(fn: (c: IORedis) => Promise<T>): Promise<T> {
    let c = idle.pop();
    if (!c) {
      c = watch(main.duplicate());
      all.add(c);
    }
    try {
      return await fn(c);
    } finally {
      idle.push(c);
    }
  }

  async function single(cmd: string[]): Promise<Reply> {
    if (REFUSED.has(cmd[0]!.toUpperCase())) throw new BadRequest(`ERR command ${cmd[0]} is not supported over REST`);
    const run = (c: IORedis) => c.callBuffer(cmd[0]!, ...cmd.slice(1)) as Promise<Reply>;
    return isBlocking(cmd) ? withBlocking(run) : run(main);
  }

  async function batch(cmds: string[][], atomic: boolean): Promise<Reply[]> {
    for (const c of cmds) {
      if (REFUSED.has(c[0]!.toUpperCase())) throw new BadRequest(`ERR command ${c[0]} is not supported over REST`);
    }
    const p = atomic ? main.multi() : main.pipeline();
    for (const c of cmds) p.callBuffer(c[0]!, ...c.slice(1));
    const res = await p.exec();
    if (!res) throw new BadRequest("ERR transaction aborted");
    return res.map(([err, v]) => (err ? (err as Error) : (v as Reply)));
  }

  const server = listen({
    port: opts.port,
    hostname: opts.hostname ?? "127.0.0.1",
    async fetch(req) {
      if (req.method !== "POST") return json({ error: "ERR only POST is supported" }, 405);
      if (req.headers.get("authorization") !== expected) return json({ error: "Unauthorized" }, 401);
      const path = new URL(req.url).pathname.replace(/\/+$/, "") || "/";
      if (path !== "/" && path !== "/pipeline" && path !== "/multi-exec") return json({ error: `ERR unknown path ${path}` }, 404);
      const base64 = (req.headers.get("upstash-encoding") ?? "").toLowerCase() === "base64";
      const max = opts.maxBodyBytes ?? DEFAULT_BRIDGE_MAX_BODY;
      let body: unknown;
      try {
        body = JSON.parse(await readLimited(req, max));
      } catch (e) {
        if (e instanceof TooLarge) return json({ error: `ERR request body larger than ${max} bytes` }, 413);
        return json({ error: "ERR request body is not JSON" }, 400);
      }
      try {
        if (path === "/") return json({ result: encodeReply(await single(parseCommand(body)), base64) });
        if (!Array.isArray(body) || body.length === 0) throw new BadRequest("ERR a pipeline must be a non-empty array of commands");
        const replies = await batch(body.map(parseCommand), path === "/multi-exec");
        return json(replies.map((r) => (r instanceof Error ? { error: r.message } : { result: encodeReply(r, base64) })));
      } catch (e) {
        const msg = e instanceof Error ? e.message : String(e);
        // Redis errors and bad requests are 400 as on Upstash; a lost connection is a 500.
        const redisError = e instanceof BadRequest || (e instanceof Error && /^[A-Z]+ /.test(msg));
        return json({ error: msg }, redisError ? 400 : 500);
      }
    },
  });

  return {
    url: `http://${server.hostname}:${server.port}`,
    port: server.port as number,
    async stop() {
      server.stop(true);
      await Promise.all([...all].map((c) => c.quit().catch(() => c.disconnect())));
    },
  };
}
