import type { RedisCommander } from "./redis-commander.ts";
import { isStoreOutage } from "./store-outage.ts";

/** What `GET /health` reports about the store: reachable or not, named by its (masked) URL. */
export interface StoreHealth {
  ok: boolean;
  /** The store, e.g. `redis://127.0.0.1:6379` or an Upstash REST URL (no credentials). */
  store: string;
  /** Why it is unreachable (absent when ok). */
  error?: string;
}

/**
 * A store check for `/health`: `PING` through `commander` within
 * `timeoutMs`. `known` may answer at once from a connection's own state
 * (e.g. an ioredis connection known to be down) and skip the ping. An error
 * Redis answered still means the store is reachable; only an outage
 * ({@link isStoreOutage}) or no answer in time is not ok. Runtime-free.
 */
export function storeHealthProbe(
  name: string,
  commander: RedisCommander | null,
  opts: { timeoutMs?: number; known?: () => StoreHealth | null } = {},
): () => Promise<StoreHealth> {
  const timeoutMs = opts.timeoutMs ?? 1_000;
  if (!commander) return async () => ({ ok: true, store: name });
  return async () => {
    const known = opts.known?.();
    if (known) return known;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    try {
      await Promise.race([
        commander.exec(["PING"]),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            timedOut = true;
            reject(new Error(`no answer to PING within ${timeoutMs} ms`));
          }, timeoutMs);
        }),
      ]);
      return { ok: true, store: name };
    } catch (e) {
      if (!timedOut && !isStoreOutage(e)) return { ok: true, store: name };
      return { ok: false, store: name, error: (e instanceof Error ? e.message : String(e)).slice(0, 300) };
    } finally {
      clearTimeout(timer);
    }
  };
}

/** The `/health` response for a store check: 200 `{ok: true, ...extra}` or 503 naming the store. */
export function healthResponse(h: StoreHealth, extra: Record<string, unknown> = {}): Response {
  const headers = { "content-type": "application/json" };
  if (h.ok) return new Response(JSON.stringify({ ok: true, ...extra }), { headers });
  const message = `store ${h.store} is unreachable${h.error ? `: ${h.error}` : ""}`;
  return new Response(JSON.stringify({ ok: false, ...extra, store: h.store, error: { code: "store_unreachable", message } }), {
    status: 503,
    headers: { ...headers, "retry-after": "1" },
  });
}
