import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { IoRedisCommander, isWriteCommand } from "../../infra/redis/ioredis-commander.ts";
import { replicaShortfall } from "../../infra/redis/redis-check.ts";
import { processStoreHealth } from "../../infra/cli/store-watch.ts";
import { ROWS } from "../session/fixtures.ts";
import { holdWhileStoreDown, isStoreOutage } from "../../shared/store/store-outage.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { privateCluster, type PrivateCluster } from "../helpers/redis-cluster.ts";
import { spawnCli } from "../chaos/store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { makeRecord } from "./contract.ts";

// store.durability replicated (issue 31 item 4): every write is followed by WAIT on its own connection, and a
// write the replicas did not acknowledge in time is an outage (held, retried), never taken as done.

/** Resolves once `fn` is true (each poll a real round trip), or throws after a hang bound. */
async function until(what: string, fn: () => Promise<boolean>): Promise<void> {
  const end = Date.now() + 60_000;
  while (!(await fn().catch(() => false))) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(20);
  }
}

test("replicaShortfall reads INFO replication: online replicas acknowledging within 2 s count; a replica is refused", () => {
  const info = (slaves: string[], role = "master") => `# Replication\r\nrole:${role}\r\nconnected_slaves:${slaves.length}\r\n${slaves.map((x, i) => `slave${i}:ip=127.0.0.1,port=${7000 + i},${x}\r\n`).join("")}master_repl_offset:10\r\n`;
  expect(replicaShortfall(info(["state=online,offset=10,lag=0"]), 1, "redis://h:1")).toBeNull();
  expect(replicaShortfall(info(["state=online,offset=10,lag=1", "state=online,offset=3,lag=9"]), 2, "redis://h:1")).toBe("redis://h:1 has 1 replica acknowledging (2 connected; INFO replication), store.wait_replicas is 2");
  expect(replicaShortfall(info(["state=wait_bgsave,offset=0,lag=0"]), 1, "redis://h:1")).toBe("redis://h:1 has 0 replicas acknowledging (1 connected; INFO replication), store.wait_replicas is 1");
  expect(replicaShortfall(info([], "slave"), 1, "redis://h:1")).toBe("redis://h:1 is a replica (role slave): point store.url at the primary");
});

test("which commands count as writes", () => {
  expect(["EVALSHA", "EVAL", "SET", "XADD", "XACK", "HSET", "DEL", "UNLINK", "EXPIRE", "ZADD", "INCR"].map((c) => isWriteCommand([c, "k"]))).toEqual(Array(11).fill(true));
  expect(["GET", "hgetall", "XRANGE", "XREADGROUP", "SCAN", "TIME", "PING", "EVALSHA_RO", "WAIT", "ZREVRANGEBYLEX", "ZRANGEBYLEX"].map((c) => isWriteCommand([c, "k"]))).toEqual(Array(11).fill(false));
});

describe("one primary and its replica", () => {
  let primary: PrivateRedis;
  let replica: PrivateRedis;
  beforeAll(async () => {
    // No 5 s wait before the replica's first (diskless) sync.
    primary = await privateRedis({ args: ["--repl-diskless-sync-delay", "0"] });
    replica = await privateRedis({ args: ["--replicaof", "127.0.0.1", String(primary.port)] });
    const c = primary.client();
    try {
      await until("the replica online", async () => /^slave0:.*state=online/m.test(await c.info("replication")));
    } finally {
      await c.quit();
    }
  });
  afterAll(async () => {
    await replica?.dispose();
    await primary?.dispose();
  });

  test("a put returns only once the replica holds the record's exact bytes", async () => {
    const q = createRedisTransferQueue({ url: primary.url, prefix: "dur:", durability: { replicas: 1, timeoutMs: 5_000 } });
    const onReplica = replica.client();
    const onPrimary = primary.client();
    try {
      for (let i = 0; i < 20; i++) {
        const r = makeRecord(`g${i}`, 0);
        expect(await q.put(r)).toMatchObject({ stored: true });
        // Read right after the put returned, no wait in between: WAIT made the put include the replication.
        const name = q.layout.traj(r.key);
        const [a, b] = await Promise.all([onReplica.hgetall(name), onPrimary.hgetall(name)]);
        expect(Object.keys(a).length).toBeGreaterThan(0);
        expect(a).toEqual(b);
      }
    } finally {
      await onReplica.quit();
      await onPrimary.quit();
      await q.close();
    }
  });

  test("a replica that stops acknowledging fails the put as an outage naming the count; the held put lands once when it is back", async () => {
    const q = createRedisTransferQueue({ url: primary.url, prefix: "dur2:", durability: { replicas: 1, timeoutMs: 300 } });
    const r = makeRecord("stalled", 0);
    replica.signal("SIGSTOP");
    let resumed = false;
    try {
      const err = await q.put(r).then(() => null, (e: unknown) => e as Error);
      expect(isStoreOutage(err)).toBe(true);
      expect(err!.message).toBe(`store ${primary.url} unreachable: 0 of 1 replica acknowledged a write within 300 ms (store.durability replicated: not taken as done; a retryable outage)`);
      // The product's writers hold a put while the store is "down" and retry it: here it succeeds once the replica answers again.
      let attempts = 0;
      const held = holdWhileStoreDown(() => (attempts++, q.put(r)), { minTimeoutMs: 20, maxTimeoutMs: 100 });
      await until("a second refused attempt", async () => attempts >= 2);
      replica.signal("SIGCONT");
      resumed = true;
      // Meanwhile the commander reports the store down (as /health and --store-timeout read it), and its health probe says why.
      const c = (q as unknown as { redis: IoRedisCommander }).redis;
      expect(c.connection()).toMatchObject({ up: false, error: "0 of 1 replica acknowledged a write within 300 ms" });
      // The first attempt already wrote to the primary: the retry finds the key stored (a put is idempotent by key).
      expect(await held).toMatchObject({ stored: false });
      expect(c.connection().up).toBe(true);
      expect((await q.groupStatus("stalled")).records).toBe(1);
      expect(await q.get(r.key)).toEqual(r);
    } finally {
      if (!resumed) replica.signal("SIGCONT");
      await q.close();
    }
  });

  test("reads never wait: GET with the replica stopped answers at once", async () => {
    const c = new IoRedisCommander(primary.url, { durability: { replicas: 1, timeoutMs: 60_000 } });
    replica.signal("SIGSTOP");
    try {
      // A 60 s WAIT after a read would hang this past the test's bound; a read is sent alone.
      expect(await c.exec(["GET", "dur:none"])).toBeNull();
      expect(await c.pipeline([["GET", "dur:none"], ["HGETALL", "dur:none"]])).toEqual([null, []]);
    } finally {
      replica.signal("SIGCONT");
      await c.close();
    }
  });

  test("/health's probe: down while the replica does not acknowledge (INFO lag), up again after", async () => {
    const c = new IoRedisCommander(primary.url, { durability: { replicas: 1, timeoutMs: 200 } });
    const probe = processStoreHealth(primary.url, c);
    try {
      expect(await probe()).toEqual({ ok: true, store: primary.url });
      replica.signal("SIGSTOP");
      try {
        const down = await (async () => {
          for (;;) {
            const h = await probe();
            if (!h.ok) return h;
            await Bun.sleep(100);
          }
        })();
        expect(down).toEqual({ ok: false, store: primary.url, error: `${primary.url} has 0 replicas acknowledging (1 connected; INFO replication), store.wait_replicas is 1` });
      } finally {
        replica.signal("SIGCONT");
      }
      await until("the probe up again", async () => (await probe()).ok);
    } finally {
      await c.close();
    }
  }, HANG_MS);

  test("a replica stall in the middle of a batch: every record stored and counted once (none as another batch's), then the batch ends", async () => {
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-dur-"));
    const cfg = join(dir, "config.json");
    writeFileSync(cfg, JSON.stringify({ store: { url: primary.url, prefix: "stall:", durability: "replicated", wait_timeout_ms: 200 } }));
    const rt = await buildRuntime({ config: cfg, engine: "sim", n: 4, maxModelLen: 4096, concurrency: 32 });
    const raw = primary.client();
    try {
      const rows = Array.from({ length: 24 }, (_, i) => ({ ...ROWS[i % ROWS.length], uid: `st${i}` }));
      const b = rt.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
      const done = b.run.run();
      await until("8 records", async () => b.run.stats().counts.records >= 8);
      replica.signal("SIGSTOP");
      try {
        // Over 2 s without an acknowledgement: WAITs of 200 ms have failed, puts are held.
        await until("the replica 2 s behind", async () => /^slave0:.*lag=([3-9]|\d\d)/m.test(await raw.info("replication")));
        expect(b.run.stats().done).toBe(false);
      } finally {
        replica.signal("SIGCONT");
      }
      await done;
      expect(b.run.stats().counts).toMatchObject({ total: 96, finished: 96, records: 96, ok: 96, failed: 0, reused: 0 });
      expect((await raw.keys("stall:traj:*")).length).toBe(96);
    } finally {
      await raw.quit();
      await rt.close();
    }
  }, HANG_MS);

  test("the CLI refuses replicated durability on a server without the replicas, on the memory store and on Upstash", async () => {
    const lone = await privateRedis();
    try {
      const runs = [
        ["serve", "--port", "0", "--store", lone.url, "--store-durability", "replicated"],
        ["serve", "--port", "0", "--store-durability", "replicated"],
        ["worker", "--store", "upstash", "--store-durability", "replicated"],
        ["serve", "--port", "0", "--store", replica.url, "--store-durability", "replicated"],
      ].map((args) => spawnCli(args, { UPSTASH_REDIS_REST_URL: "http://127.0.0.1:1", UPSTASH_REDIS_REST_TOKEN: "t" }));
      const codes = await Promise.all(runs.map((p) => p.proc.exited));
      expect(codes).toEqual([2, 2, 2, 2]);
      expect(runs[0]!.err()).toContain(`store.durability: replicated needs 1 acknowledging replica (store.wait_replicas): ${lone.url} has 0 replicas acknowledging (0 connected; INFO replication), store.wait_replicas is 1`);
      expect(runs[3]!.err()).toContain(`store.durability: replicated needs 1 acknowledging replica (store.wait_replicas): ${replica.url} is a replica (role slave): point store.url at the primary`);
      expect(runs[1]!.err()).toContain("--store-durability: applies to a Redis store (--store); the memory store has no replicas");
      expect(runs[2]!.err()).toContain("--store-durability: replicated applies to a Redis store over TCP (redis:// or redis+cluster://); WAIT counts the replicas that acknowledged one connection's writes, and Upstash REST keeps no connection");
      // WAIT settings without replicated durability would do nothing: refused.
      const dir = mkdtempSync(join(tmpdir(), "edgeloop-dur-"));
      const cfg = join(dir, "c.json");
      writeFileSync(cfg, JSON.stringify({ store: { url: lone.url, wait_replicas: 3 } }));
      const ignored = spawnCli(["serve", "--port", "0", "--config", cfg]);
      expect(await ignored.proc.exited).toBe(2);
      expect(ignored.err()).toContain("store.wait_replicas: applies with store.durability: replicated (--store-durability replicated); with primary durability no write waits for replicas");
      // gc waits for no replica: it runs on a primary without one.
      writeFileSync(cfg, JSON.stringify({ store: { url: lone.url, prefix: "gcdur:", durability: "replicated" } }));
      const gc = spawnCli(["gc", "--config", cfg, "--dry-run"]);
      expect([await gc.proc.exited, gc.err()]).toEqual([0, expect.any(String)]);
    } finally {
      await lone.dispose();
    }
  }, HANG_MS);
});

describe("a 3-master + 3-replica cluster loses a master mid-stream", () => {
  let cluster: PrivateCluster;
  beforeAll(async () => {
    cluster = await privateCluster(3, { replicas: 1, nodeTimeoutMs: 1_000 });
  });
  afterAll(async () => {
    await cluster?.dispose();
  });

  test("with replicated durability every put lands exactly once and every group is delivered once", async () => {
    const N = 4;
    const GROUPS = 240;
    const q = createRedisTransferQueue({ url: cluster.url, shards: 3, prefix: "fo:", durability: { replicas: 1, timeoutMs: 1_000 } });
    const reader = createRedisTransferQueue({ url: cluster.url, shards: 3, prefix: "fo:" });
    try {
      const before = await cluster.masters();
      expect(before.length).toBe(3);
      for (let g = 0; g < GROUPS; g++) await q.expectGroup(`fo${g}`, N);
      let done = 0;
      let failedAttempts = 0;
      let next = 0;
      const writers = Array.from({ length: 8 }, async () => {
        while (next < GROUPS * N) {
          const i = next++;
          const r = makeRecord(`fo${i >> 2}`, i & 3);
          await holdWhileStoreDown(() => q.put(r), { minTimeoutMs: 50, maxTimeoutMs: 500, onRetry: () => failedAttempts++ });
          done++;
        }
      });
      // Kill the master of the shard the first group stream lives on once a quarter is written.
      await until("a quarter of the puts", async () => done >= (GROUPS * N) / 4);
      const victim = before.find((m) => m.firstSlot === 0)!;
      await cluster.kill(victim.port);
      // Its replica is promoted, and is then a master without a replica: no write to its slots can be made
      // durable, so those puts are held (never taken as done) while the others go on.
      await until("the replica promoted", async () => (await cluster.masters()).some((m) => m.firstSlot === 0 && m.port !== victim.port));
      const heldAt = failedAttempts;
      await until("puts to the promoted shard held", async () => failedAttempts > heldAt + 8);
      const stuck = done;
      expect(stuck).toBeLessThan(GROUPS * N);
      // The dead node comes back (its nodes.conf, no data), rejoins as the new master's replica, and the held puts land.
      cluster.restart(victim.port);
      await Promise.all(writers);
      const after = await cluster.masters();
      expect(after.map((m) => m.port)).not.toContain(victim.port);
      expect(after.length).toBe(3);
      // Every record once, every group counted exactly N.
      for (let g = 0; g < GROUPS; g++) expect([g, (await q.groupStatus(`fo${g}`)).records]).toEqual([g, N]);
      // Every group delivered once to one consumer group.
      const seen = new Map<string, number>();
      for (let reads = 0; seen.size < GROUPS && reads < 200; reads++) {
        const got = await reader.readCompleteGroups({ consumer: "t", max: 100, block_ms: 100 });
        for (const gr of got) seen.set(gr.uid, (seen.get(gr.uid) ?? 0) + 1);
        if (got.length) await reader.ack(got.map((gr) => gr.delivery_id));
      }
      expect(seen.size).toBe(GROUPS);
      expect([...seen.values()].every((c) => c === 1)).toBe(true);
      console.log(`failover: ${GROUPS * N} puts, master :${victim.port} killed after ${(GROUPS * N) / 4}, ${stuck} done while its shard had no replica, ${failedAttempts} attempts held and retried, 0 lost`);
    } finally {
      await q.close();
      await reader.close();
    }
  }, HANG_MS);
});
