import { Redis } from "@upstash/redis";
import { AuthError, ConfigError, InputError, StoreError } from "../errors.ts";
import type { RedisArg, RedisCommander, RedisReply } from "./redis-commander.ts";
import { RedisTransferQueue, type RedisTransferQueueOptions } from "./redis-transfer-queue.ts";
import { checkCommand, pipelineBySize, UPSTASH_MAX_REQUEST_BYTES } from "./request-size.ts";
import { StoreUnreachableError } from "./store-outage.ts";

/**
 * Whether a failed REST call means the store could not be reached: a
 * network failure (fetch threw) or an HTTP error whose message is not a
 * Redis error reply. Redis error replies start with an upper-case error code
 * (`ERR …`, `NOGROUP …`, `WRONGTYPE …`); the bridge and Upstash answer a lost
 * Redis connection with other text (HTTP 5xx).
 */
function unreachable(e: unknown): boolean {
  const msg = e instanceof Error ? e.message : String(e);
  return !/^[A-Z][A-Z_]+ /.test(msg) && !/unauthori[sz]ed/i.test(msg);
}

/** The slice of `@upstash/redis`'s HTTP client used here: one request, `{result, error}` (an array for pipelines). */
interface UpstashRequester {
  request(req: { body: unknown; path?: string[] }): Promise<unknown>;
}

/** Exposes the protected HTTP client of `@upstash/redis` so raw pipelines (`/pipeline`) can be sent. */
class RawUpstash extends Redis {
  get requester(): UpstashRequester {
    return this.client as unknown as UpstashRequester;
  }
}

/** Options of {@link UpstashCommander}. */
export interface UpstashCommanderOptions {
  /** REST URL (`UPSTASH_REDIS_REST_URL`), e.g. `https://….upstash.io` or a local bridge `http://127.0.0.1:8079`. */
  url: string;
  /** REST token (`UPSTASH_REDIS_REST_TOKEN`), sent as `Authorization: Bearer`. */
  token: string;
  /** Retries on network errors (the SDK's default is 5 with exponential backoff); 0 disables. */
  retries?: number;
  /**
   * Largest request body, bytes (default {@link UPSTASH_MAX_REQUEST_BYTES}, Upstash's own limit;
   * set it to your plan's, and at most the bridge's `maxBodyBytes`). Pipelines are split to fit;
   * a single command over it is refused (413 `request_too_large`) without being sent.
   */
  maxRequestBytes?: number;
}

function toWire(arg: RedisArg): string {
  if (typeof arg === "string") return arg;
  throw new InputError("command", "Upstash REST bodies are JSON: byte arguments must be encoded as text first");
}

/**
 * A {@link RedisCommander} over the Upstash REST API through `@upstash/redis`
 * with `automaticDeserialization: false` (payloads are never re-parsed) and
 * the SDK's default `Upstash-Encoding: base64` responses. Strings only: the
 * queue layout stores text, so nothing depends on raw bytes surviving JSON.
 * Runtime-free (fetch only).
 * @see https://upstash.com/docs/redis/features/restapi
 */
export class UpstashCommander implements RedisCommander {
  readonly redis: Redis;
  /** The REST URL, for messages. */
  readonly url: string;
  readonly maxRequestBytes: number;
  private readonly http: UpstashRequester;

  constructor(opts: UpstashCommanderOptions) {
    if (!/^https?:\/\//.test(opts.url ?? "")) throw new ConfigError("url", "set UPSTASH_REDIS_REST_URL to an http(s) URL");
    if (!opts.token) throw new ConfigError("token", "set UPSTASH_REDIS_REST_TOKEN");
    const raw = new RawUpstash({
      url: opts.url,
      token: opts.token,
      responseEncoding: "base64",
      retry: opts.retries === 0 ? false : { retries: opts.retries ?? 5 },
      automaticDeserialization: false,
      enableTelemetry: false,
      enableAutoPipelining: false,
    });
    this.redis = raw;
    this.url = opts.url;
    this.http = raw.requester;
    this.maxRequestBytes = opts.maxRequestBytes ?? UPSTASH_MAX_REQUEST_BYTES;
  }

  async exec(cmd: RedisArg[]): Promise<RedisReply> {
    checkCommand(cmd, this.maxRequestBytes, "json");
    const res = (await this.request({ body: cmd.map(toWire) })) as { result?: RedisReply; error?: string };
    if (res.error) throw new Error(res.error);
    return res.result ?? null;
  }

  async pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    return pipelineBySize(cmds, this.maxRequestBytes, "json", async (batch) => {
      const res = (await this.request({ body: batch.map((c) => c.map(toWire)), path: ["pipeline"] })) as {
        result?: RedisReply;
        error?: string;
      }[];
      return res.map((r) => (r.error ? new Error(r.error) : (r.result ?? null)));
    });
  }

  /** One REST request; a store that cannot be reached is a {@link StoreUnreachableError} (Redis error replies pass through). */
  private async request(req: { body: unknown; path?: string[] }): Promise<unknown> {
    try {
      return await this.http.request(req);
    } catch (e) {
      if (!unreachable(e)) throw e;
      throw new StoreUnreachableError(`store ${this.url} unreachable: ${e instanceof Error ? e.message : String(e)}`.slice(0, 500), { cause: e });
    }
  }

  async close(): Promise<void> {}
}

/** Options of {@link createUpstashTransferQueue}: REST credentials plus the queue options. */
export interface UpstashTransferQueueOptions extends UpstashCommanderOptions, RedisTransferQueueOptions {}

/**
 * The transfer queue over Upstash REST (Workers, Deno Deploy, anywhere with fetch).
 * Same layout as the TCP adapter, so one Redis can be written over REST and read by redis-py.
 */
export function createUpstashTransferQueue(opts: UpstashTransferQueueOptions): RedisTransferQueue {
  return new RedisTransferQueue(new UpstashCommander(opts), opts);
}

/**
 * A cheap read (`PING`, no retries) against an Upstash REST endpoint within
 * `timeoutMs`, so a wrong URL or token fails at start-up with a clear
 * message instead of every batch failing (or waiting) later.
 * @throws AuthError when the endpoint answers 401 (wrong `UPSTASH_REDIS_REST_TOKEN`);
 *   StoreError naming the URL when it cannot be reached or answers otherwise.
 */
export async function checkUpstash(opts: { url: string; token: string; timeoutMs?: number }): Promise<void> {
  const timeoutMs = opts.timeoutMs ?? 3_000;
  const cmd = new UpstashCommander({ url: opts.url, token: opts.token, retries: 0 });
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    await Promise.race([
      cmd.exec(["PING"]),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
  } catch (e) {
    const inner = e instanceof StoreUnreachableError ? e.cause : e;
    const msg = (inner as Error)?.message ?? String(inner);
    if (/unauthori[sz]ed|401/i.test(msg)) {
      throw new AuthError(`the Upstash store at ${opts.url} refused the token (401 Unauthorized): check UPSTASH_REDIS_REST_TOKEN`, { cause: e });
    }
    throw new StoreError(`cannot reach the Upstash store at ${opts.url} (UPSTASH_REDIS_REST_URL): ${msg}`, { cause: e, retryable: false });
  } finally {
    clearTimeout(timer);
  }
}
