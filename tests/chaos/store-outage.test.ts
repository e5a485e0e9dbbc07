import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { drainGroups, post, progress, spawnCli, spawnServe, summaryOf, until, type CliProc } from "./store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

/** The flags shared with serve minus --n: a worker runs each job with its batch's rollout section and refuses --n. */
const workerFlags = (flags: string[]): string[] => flags.filter((_, i) => flags[i] !== "--n" && flags[i - 1] !== "--n");

// E7 (store chaos): Redis goes away for OUTAGE_S seconds in the middle of a queue-mode batch
// (serve + 2 workers) and comes back — with its data (append-only file: a pure outage) or without
// it (no persistence: the outage is also E2's data loss). Every trajectory lands exactly once or is
// reported lost by the API; none waits forever; /health answers 503 naming the store meanwhile;
// no worker idles out. On main: ioredis gave up after ~40 s (30 reconnects), BatchRun.store after
// 5 retries (~2 s), and a worker exited "idle" with jobs queued.
// The outage length is a parameter: EDGELOOP_CHAOS_OUTAGE_S (default 25 here; `npm run soak:store`
// runs 90). Reconnects are capped at 500 ms apart (EDGELOOP_STORE_RECONNECT_MAX_MS) so that a 25 s
// outage takes more than the 30 attempts after which main's ioredis client gave up for good.
const OUTAGE_S = Number(process.env.EDGELOOP_CHAOS_OUTAGE_S ?? 25);
const RECONNECT_MAX_MS = 500;
const OLD_MAX_RECONNECTS = 30;
const ROWS_N = 24;
const N = 2;
const env = { EDGELOOP_STORE_RECONNECT_MAX_MS: String(RECONNECT_MAX_MS) };

describe(`E7: a ${OUTAGE_S} s Redis outage in the middle of a queue-mode batch`, () => {
  let engine: RunningSimEngine;
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-outage-"));
  const procs: CliProc[] = [];
  const rows = Array.from({ length: ROWS_N }, (_, i) => ({ ...ROWS[i % ROWS.length], uid: `out${i}` }));

  beforeAll(async () => {
    engine = await startSimEngine({ script: { ...POLICY, seed: 5 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 8 } });
  });
  afterAll(async () => {
    for (const p of procs) p.proc.kill("SIGKILL");
    await engine.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const outage = async (redis: PrivateRedis, healthUrl: string | null, alive: CliProc[]) => {
    await redis.stop();
    const t0 = Date.now();
    if (healthUrl) {
      const res = await until(async () => {
        const r = await fetch(`${healthUrl}/health`);
        return r.status === 503 ? r : (await r.body?.cancel(), null);
      }, "/health 503", 10_000, 100);
      expect(await res.json()).toEqual({
        ok: false,
        store: redis.url,
        error: { code: "store_unreachable", message: expect.stringMatching(new RegExp(`^store ${redis.url.replaceAll("/", "\\/")} is unreachable: `)) as unknown as string },
      });
    }
    await Bun.sleep(Math.max(0, OUTAGE_S * 1000 - (Date.now() - t0)));
    for (const p of alive) expect([p.proc.exitCode, p.err().slice(-300)]).toEqual([null, expect.any(String)]);
    await redis.start();
  };

  for (const persist of [true, false]) {
    const mode = persist ? "restart with its data (append-only file): every trajectory lands exactly once" : "restart without persistence (data lost too): each trajectory lands once or is reported lost";
    test(mode, async () => {
      const redis = await privateRedis({ persist });
      const prefix = persist ? "e7a:" : "e7b:";
      try {
        const common = ["--store", redis.url, "--store-prefix", prefix, "--engine", engine.urls[0]!, "--n", String(N), "--max-model-len", "4096"];
        const serve = await spawnServe([...common, "--lost-grace", "5"], env);
        procs.push(serve);
        const workers = ["wa", "wb"].map((c) => spawnCli(["worker", ...workerFlags(common), "--concurrency", "4", "--lease", "3", "--idle-exit", "4", "--consumer", c], env));
        procs.push(...workers);
        const b = await post(serve.url, rows);
        expect(b.keys.length).toBe(ROWS_N * N);
        const before = await until(async () => {
          const p = await progress(serve.url, b.batch_id);
          return p.counts.ok >= 6 ? p : null;
        }, "six records before the outage", 60_000, 20);
        expect(before.done).toBe(false);

        await outage(redis, serve.url, [serve, ...workers]);

        const p = await until(async () => {
          const x = await progress(serve.url, b.batch_id);
          return x.done ? x : null;
        }, "the batch done after the outage", 120_000, 200);
        console.log(`E7 ${persist ? "persist" : "no-persist"}: ${OUTAGE_S} s outage at ${before.counts.ok} records; after: ${JSON.stringify(p.counts)} lost ${p.lost?.count ?? 0}; first errors ${JSON.stringify(p.errors.slice(0, 3))}`);
        expect(p.counts.failed).toBe(0);
        // The only error is the note of a store repair (when the restart lost data).
        expect(p.errors.filter((e: { key: string }) => e.key !== "(store)")).toEqual([]);
        const landed = (await (await fetch(`${serve.url}/v1/rollouts/${b.batch_id}/trajectories`)).text()).trim().split("\n").map((l) => (JSON.parse(l) as { key: string }).key);
        expect(new Set(landed).size).toBe(landed.length);
        if (persist) {
          expect(p.lost).toBeNull();
          // Every session finished, none failed. A 25 s outage outlives the 2 s job lease, so an idle worker that stays
          // to reclaim (N1) may take a live worker's job once the store is back: both run the session, its durable
          // session lets one write, and the other's first delivery then reports it "reused" (counted, not stored
          // twice). Known mislabel (issue 27, "this is mine"): records + reused is every trajectory; the listing and
          // the groups below check exactly-once delivery itself.
          expect(p.counts).toMatchObject({ total: ROWS_N * N, pending: 0, running: 0, finished: ROWS_N * N, failed: 0 });
          expect([p.counts.records + p.counts.reused, p.counts.ok]).toEqual([ROWS_N * N, p.counts.records]);
          expect(landed.sort()).toEqual([...b.keys].sort());
          // Exactly once for the trainer too: every group delivered once, with its n records.
          const groups = await drainGroups(serve.url, rows.map((r) => r.uid), 30_000);
          for (const r of rows) expect([r.uid, groups.get(r.uid)]).toEqual([r.uid, [[`${r.uid}_0_0`, `${r.uid}_1_0`]]]);
        } else {
          expect(p.lost).not.toBeNull();
          expect(p.lost!.missing).toContain(`${prefix}jobs:batch:${b.batch_id}`);
          expect([...landed, ...p.lost!.keys].sort()).toEqual([...b.keys].sort());
          // Groups whose sessions all landed are put back by serve (BatchRun.repairStore) and reach the trainer, once.
          const whole = rows.map((r) => r.uid).filter((u) => landed.includes(`${u}_0_0`) && landed.includes(`${u}_1_0`));
          expect(whole.length).toBeGreaterThan(0);
          const delivered = await drainGroups(serve.url, whole, 30_000);
          for (const u of whole) expect([u, delivered.get(u)]).toEqual([u, [[`${u}_0_0`, `${u}_1_0`]]]);
          // The queue heals: a batch submitted afterwards runs (on a fresh worker: the others may have idled out) and its group is delivered.
          const next = await post(serve.url, [{ ...rows[0], uid: "outnext" }]);
          const fresh = spawnCli(["worker", ...workerFlags(common), "--concurrency", "4", "--idle-exit", "3", "--consumer", "wc"], env);
          procs.push(fresh);
          await until(async () => (await progress(serve.url, next.batch_id)).done, "a batch after the outage", HANG_MS);
          expect((await progress(serve.url, next.batch_id)).counts).toMatchObject({ ok: 2, failed: 0 });
          expect((await drainGroups(serve.url, ["outnext"])).get("outnext")).toEqual([["outnext_0_0", "outnext_1_0"]]);
          expect(await fresh.proc.exited).toBe(0);
        }
        const health = await fetch(`${serve.url}/health`);
        expect([health.status, await health.json()]).toEqual([200, { ok: true, store: redis.url }]);

        // The workers waited the outage out (more reconnect attempts than main's client made before giving up), then idled out.
        for (const w of workers) {
          expect(await w.proc.exited).toBe(0);
          const attempts = [...w.err().matchAll(/reconnected after (\d+) attempts/g)].map((m) => Number(m[1]));
          expect(attempts.length).toBeGreaterThan(0);
          // (An outage shorter than ~17 s takes fewer attempts than that at 500 ms apart.)
          if (OUTAGE_S >= 20) expect(Math.max(...attempts)).toBeGreaterThan(OLD_MAX_RECONNECTS);
          expect(w.err()).not.toContain("gave up reconnecting");
          expect(summaryOf(w).exit).toBe("idle");
        }
        const done = workers.map((w) => summaryOf(w).completed);
        if (persist) expect(done[0]! + done[1]!).toBeGreaterThanOrEqual(ROWS_N * N);
        serve.proc.kill("SIGTERM");
        await serve.proc.exited;
      } finally {
        await redis.dispose();
      }
    }, OUTAGE_S * 1000 + 180_000);
  }

  test("edgeloop rollout (inline, durable sessions) waits the outage out: every record written once, none failed", async () => {
    const redis = await privateRedis({ persist: true });
    try {
      const data = join(dir, "rows.jsonl");
      const out = join(dir, "out.jsonl");
      writeFileSync(data, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
      const p = spawnCli(["rollout", "--data", data, "--out", out, "--store", redis.url, "--store-prefix", "e7r:", "--engine", engine.urls[0]!, "--n", String(N), "--max-model-len", "4096", "--concurrency", "4", "--no-progress"], env);
      procs.push(p);
      await until(async () => Number(/progress\s+(\d+)\//.exec(p.err().split("\n").filter((l) => l.startsWith("progress")).pop() ?? "")?.[1] ?? 0) >= 6 || null, "six records", HANG_MS, 50);
      await outage(redis, null, [p]);
      expect(await p.proc.exited).toBe(0);
      const keys = readFileSync(out, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { key: string; error: string | null });
      expect(keys.filter((r) => r.error !== null)).toEqual([]);
      expect(keys.map((r) => r.key).sort()).toEqual(rows.flatMap((r) => [`${r.uid}_0_0`, `${r.uid}_1_0`]).sort());
      expect(p.err()).toMatch(/reconnected after \d+ attempts/);
    } finally {
      await redis.dispose();
    }
  }, OUTAGE_S * 1000 + 120_000);

  test("--store-timeout: a worker exits non-zero with one line once the store stays unreachable that long", async () => {
    const redis = await privateRedis();
    try {
      const w = spawnCli(["worker", "--store", redis.url, "--store-prefix", "e7t:", "--engine", engine.urls[0]!, "--store-timeout", "2", "--consumer", "wt"], env);
      procs.push(w);
      await until(async () => w.err().includes("worker     wt"), "the worker up", HANG_MS);
      await redis.stop();
      const t0 = Date.now();
      expect(await w.proc.exited).toBe(1);
      const took = (Date.now() - t0) / 1000;
      expect(took).toBeGreaterThanOrEqual(2);
      expect(took).toBeLessThan(8);
      // (The outage line names the bound too: "(reconnecting, until it answers or for at most 2 s (--store-timeout))".)
      const lines = w.err().trim().split("\n").filter((l) => l.includes("(--store-timeout 2)"));
      expect(lines.length).toBe(1);
      expect(lines[0]).toMatch(new RegExp(`^edgeloop: store ${redis.url.replaceAll("/", "\\/")} unreachable for \\d+ s \\(--store-timeout 2\\): .+; exiting$`));
    } finally {
      await redis.dispose();
    }
  }, HANG_MS);
});
