import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { storeHealthProbe, type StoreHealth } from "../../shared/store/store-health.ts";
import { IoRedisCommander } from "../redis/ioredis-commander.ts";

/**
 * Whether the store answers now: `PING` over the process's own connection
 * within `timeoutMs`; an ioredis connection known to be down answers at
 * once. With `store.durability: replicated` the store is down too while its
 * replicas do not acknowledge (`IoRedisCommander.replicaHealth`). `name` is
 * the masked store URL.
 */
export function processStoreHealth(name: string, commander: RedisCommander | null, timeoutMs = 1_000): () => Promise<StoreHealth> {
  const known = (): StoreHealth | null => {
    if (!(commander instanceof IoRedisCommander)) return null;
    const c = commander.connection();
    if (c.up || c.downSince === null) return null;
    return { ok: false, store: name, error: `unreachable for ${Math.round((Date.now() - c.downSince) / 1000)} s: ${c.error ?? "connection lost"}` };
  };
  const probe = storeHealthProbe(name, commander, { timeoutMs, known });
  if (!(commander instanceof IoRedisCommander) || !commander.replicated) return probe;
  // store.durability replicated: a store whose replicas do not acknowledge holds every write, as an outage does.
  return async () => {
    const h = await probe();
    if (!h.ok) return h;
    const why = await commander.replicaHealth().catch((e: unknown) => `replication check failed: ${(e as Error)?.message ?? String(e)}`);
    return why ? { ok: false, store: name, error: why } : h;
  };
}

/**
 * `--store-timeout SECONDS`: probes the store every second and calls
 * `onExpire` (once) with one line when it has been unreachable for longer
 * than `timeoutS` in a row. Without a timeout nothing is watched (the
 * process waits the outage out). Returns a stop function. The timer does not
 * keep the process alive.
 */
export function watchStore(probe: () => Promise<StoreHealth>, timeoutS: number | undefined, onExpire: (line: string) => void): () => void {
  if (timeoutS === undefined || !(timeoutS > 0)) return () => {};
  let downSince: number | null = null;
  let busy = false;
  let fired = false;
  const t = setInterval(async () => {
    if (busy || fired) return;
    busy = true;
    try {
      const h = await probe();
      if (h.ok) downSince = null;
      else {
        downSince ??= Date.now();
        if (Date.now() - downSince >= timeoutS * 1000) {
          fired = true;
          onExpire(`edgeloop: store ${h.store} unreachable for ${Math.round((Date.now() - downSince) / 1000)} s (--store-timeout ${timeoutS}): ${h.error ?? "no answer"}; exiting`);
        }
      }
    } finally {
      busy = false;
    }
  }, Math.min(1_000, Math.max(100, (timeoutS * 1000) / 4)));
  (t as { unref?: () => void }).unref?.();
  return () => clearInterval(t);
}
