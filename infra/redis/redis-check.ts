import IORedis from "ioredis";
import { ConfigError, StoreError } from "../../shared/errors.ts";

/** Start-up connectivity checks give up after this long (milliseconds) by default. */
export const DEFAULT_CHECK_TIMEOUT_MS = 3_000;

/**
 * A Redis URL fit to print: the password (and a user given alone) replaced
 * by `***`, e.g. `redis://user:***@host:6379/0`. Strings that are not URLs
 * come back unchanged.
 */
export function maskRedisUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    else if (u.username) u.username = "***";
    return u.toString().replace(/\/$/, "");
  } catch {
    return url.replace(/\/\/[^@/]*@/, "//***@");
  }
}

/**
 * Opens one connection to `url`, sends PING and closes it, within
 * `timeoutMs` (connect + reply); no reconnect attempts, no offline queue, so
 * an unreachable server fails fast instead of retrying forever. With
 * `replicas` (store.durability replicated), a primary must have that many
 * replicas connected (`INFO replication` connected_slaves).
 * @throws ConfigError (`store.durability`) when it has fewer; StoreError naming the (masked) URL and the cause, e.g.
 *   `cannot reach Redis at redis://127.0.0.1:1 (--store): connect ECONNREFUSED 127.0.0.1:1`.
 */
export async function checkRedis(url: string, opts: { timeoutMs?: number; what?: string; replicas?: number } = {}): Promise<void> {
  // A cluster URL (redis+cluster://[auth@]h:p,h:p): the first seed node must answer, as a plain server would.
  const cl = /^(rediss?)\+cluster:\/\/((?:[^@/]*@)?)([^,/]+)/.exec(url);
  if (cl) return checkRedis(`${cl[1]}://${cl[2]}${cl[3]}`, opts);
  const timeoutMs = opts.timeoutMs ?? DEFAULT_CHECK_TIMEOUT_MS;
  const where = `${maskRedisUrl(url)}${opts.what ? ` (${opts.what})` : ""}`;
  let c: IORedis;
  try {
    c = new IORedis(url, { lazyConnect: true, connectTimeout: timeoutMs, retryStrategy: () => null, maxRetriesPerRequest: 0, enableOfflineQueue: false });
  } catch (e) {
    throw new StoreError(`cannot reach Redis at ${where}: ${(e as Error).message}`, { cause: e, retryable: false });
  }
  const db = redisDatabase(url);
  let lastError: Error | null = null;
  c.on("error", (e: Error) => (lastError = e));
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    });
    await Promise.race([
      (async () => {
        await c.connect();
        await c.ping();
        // ioredis answers a SELECT refused at connect ("ERR DB index is out of range") by reconnecting without
        // it, on database 0: ask again here so a wrong database number stops the start instead.
        if (db !== null) {
          try {
            await c.select(db);
          } catch (e) {
            throw new ConfigError("store.url", `database ${db} of ${maskRedisUrl(url)}: ${(e as Error).message}`);
          }
        }
        // store.durability replicated: a primary without the replicas WAIT counts would fail every write (held forever).
        if (opts.replicas) {
          const why = replicaShortfall(String(await c.info("replication")), opts.replicas, maskRedisUrl(url));
          if (why) throw new ConfigError("store.durability", `replicated needs ${opts.replicas} acknowledging replica${opts.replicas === 1 ? "" : "s"} (store.wait_replicas): ${why}`);
        }
      })(),
      timeout,
    ]);
  } catch (e) {
    if (e instanceof ConfigError) throw e;
    // ioredis rejects with "Connection is closed." once it gives up; the socket's own error says why.
    const err = lastError as Error | null;
    const msg = err?.message || (e as Error).message || String(e);
    throw new StoreError(`cannot reach Redis at ${where}: ${msg}`, { cause: e, retryable: false });
  } finally {
    clearTimeout(timer);
    c.disconnect();
  }
}

/**
 * The database number a `redis://host:port/N` URL names (the path, as
 * ioredis reads it), or null when it names none.
 * @throws ConfigError (`store.url`) when the path is not a database number.
 */
export function redisDatabase(url: string): number | null {
  let path: string;
  try {
    path = new URL(url).pathname.replace(/^\//, "");
  } catch {
    return null;
  }
  if (path === "") return null;
  if (!/^\d+$/.test(path)) throw new ConfigError("store.url", `'/${path.slice(0, 50)}' is not a database number (redis://host:port/N)`);
  return Number(path);
}

/**
 * Why `INFO replication` of a server (`url`, masked) does not show `replicas` acknowledging replicas,
 * or null when it does: a replica (role slave) takes no writes; replicas count when `state=online`
 * with `lag` ≤ 2 (seconds since their last acknowledgement; replicas acknowledge every second).
 */
export function replicaShortfall(info: string, replicas: number, url: string): string | null {
  const role = /^role:(\w+)/m.exec(info)?.[1];
  if (role && role !== "master") return `${url} is a replica (role ${role}): point store.url at the primary`;
  const connected = Number(/^connected_slaves:(\d+)/m.exec(info)?.[1] ?? 0);
  let acking = 0;
  for (const m of info.matchAll(/^slave\d+:(.*)$/gm)) {
    const f = Object.fromEntries(m[1]!.split(",").map((kv) => kv.split("=") as [string, string]));
    if (f.state === "online" && Number(f.lag) <= 2) acking++;
  }
  if (acking >= replicas) return null;
  return `${url} has ${acking} replica${acking === 1 ? "" : "s"} acknowledging (${connected} connected; INFO replication), store.wait_replicas is ${replicas}`;
}
