/**
 * Durable-session benchmark: checkpoint cost per committed step (µs, bytes of the delta)
 * for memory and Redis storage, resume latency after a kill (open a stored
 * mid-trajectory checkpoint), memory held by 10 000 sessions waiting on tool
 * callbacks, and a larger crash run (SIGKILL × 6 over 400 trajectories).
 * Run: ./node_modules/.bin/bun bench/sessions.ts  (needs Redis: REDIS_URL, default redis://127.0.0.1:6379)
 */
import { IoRedisCommander } from "../infra/redis/ioredis-commander.ts";
import { RedisSessionStorage } from "../shared/session/redis-session-storage.ts";
import { SessionHost } from "../shared/session/session-host.ts";
import { MemorySessionStorage, type SessionStorage } from "../shared/session/session-storage.ts";
import { TrajectorySession } from "../shared/session/trajectory-session.ts";
import { startToolServer } from "../infra/tools/server.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL } from "../tests/helpers/redis.ts";
import { depsFor, inputFor, sessionLoopFactory } from "../tests/session/fixtures.ts";
import { comparableRecord, crashRun, mulberry32 } from "../tests/session/crash.ts";

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
};
const rows: Record<string, string>[] = [];
const add = (what: string, value: string) => rows.push({ what, value });

class TimedStorage implements SessionStorage {
  readonly putUs: number[] = [];
  constructor(readonly inner: SessionStorage) {}
  get(k: string) {
    return this.inner.get(k);
  }
  async append(k: string, step: number, cp: string, o?: Parameters<SessionStorage["append"]>[3]) {
    const t = performance.now();
    await this.inner.append(k, step, cp, o);
    this.putUs.push((performance.now() - t) * 1000);
  }
  delete(k: string) {
    return this.inner.delete(k);
  }
}

const tools = startToolServer({ port: 0 });
const prefix = randomPrefix("bench-sessions");
const commander = new IoRedisCommander(REDIS_URL);
try {
  const { deps } = await depsFor(tools.url);
  // 1. Checkpoint cost per step on the example trajectories (tool_agent, 1–3 tool rounds).
  for (const [name, storage] of [
    ["memory", new TimedStorage(new MemorySessionStorage())],
    ["redis", new TimedStorage(new RedisSessionStorage(commander, { prefix }))],
  ] as const) {
    const bytes: number[] = [];
    const encodeUs: number[] = [];
    const stepUs: number[] = [];
    for (let i = 0; i < 120; i++) {
      const input = inputFor(i % 60, Math.floor(i / 60), undefined, `b${name}${i}`);
      const s = (await TrajectorySession.open(input.key, {
        storage,
        createLoop: sessionLoopFactory(deps),
        onCommit: (cp, n) => {
          bytes.push(n);
          const t = performance.now();
          JSON.stringify(cp);
          encodeUs.push((performance.now() - t) * 1000);
        },
      }, input))!;
      const t = performance.now();
      await s.run();
      stepUs.push(((performance.now() - t) * 1000) / s.checkpoint.step);
    }
    add(`checkpoint put, ${name} (µs, median of ${storage.putUs.length})`, median(storage.putUs).toFixed(1));
    add(`checkpoint JSON encode (µs)`, median(encodeUs).toFixed(1));
    add(`checkpoint size (bytes, median; max)`, `${median(bytes)}; ${Math.max(...bytes)}`);
    add(`whole step incl. engine + tools, ${name} (µs)`, median(stepUs).toFixed(0));
  }

  // (Commit cost against trajectory length, and bytes written per trajectory: bench/checkpoint-growth.ts.)

  // 2. Resume latency: open a session stored mid-trajectory (after its first tool round).
  for (const [name, storage] of [
    ["memory", new MemorySessionStorage()],
    ["redis", new RedisSessionStorage(commander, { prefix })],
  ] as const) {
    const input = inputFor(3, 0, undefined, `resume${name}`);
    let commits = 0;
    const s = (await TrajectorySession.open(input.key, { storage: { get: (k) => storage.get(k), delete: (k) => storage.delete(k), append: async (k, st, cp, o) => {
      if (++commits > 3) throw new Error("killed");
      await storage.append(k, st, cp, o);
    } }, createLoop: sessionLoopFactory(deps) }, input))!;
    await s.run().catch(() => {});
    const us: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = performance.now();
      await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps) });
      us.push((performance.now() - t) * 1000);
    }
    add(`resume after a kill (open + restore), ${name} (µs)`, median(us).toFixed(0));
  }

  // 3. Memory held by 10 000 sessions waiting on tool callbacks (a 202 tool).
  const asyncTool = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null, { status: 202 }) });
  const toolsJson = JSON.stringify({
    tools: ["calc", "lookup"].map((name) => ({
      name,
      url: `http://127.0.0.1:{port}/tools/${name}`,
      timeout_ms: 3_600_000,
      max_retries: 0,
      schema: { type: "function", function: { name, description: name, parameters: { type: "object", properties: {} } } },
    })),
  });
  const a = await depsFor(`http://127.0.0.1:${asyncTool.port}`, { toolsJson });
  const storage = new MemorySessionStorage();
  const host = new SessionHost({ storage, createLoop: sessionLoopFactory(a.deps) });
  Bun.gc(true);
  const heap0 = process.memoryUsage().heapUsed;
  const N = 10_000;
  const t0 = performance.now();
  const pending: Promise<unknown>[] = [];
  for (let i = 0; i < N; i++) pending.push(host.run(inputFor(i % 60, 0, undefined, `w${i}`)).catch(() => {}));
  while (storage.size < N || (await Promise.all([host.status(`w${N - 1}_0_0`)]))[0]?.phase !== "waiting") await Bun.sleep(50);
  await Bun.sleep(200);
  const ms = performance.now() - t0;
  Bun.gc(true);
  const heap1 = process.memoryUsage().heapUsed;
  add(`10 000 waiting sessions: reached in (s)`, (ms / 1000).toFixed(1));
  add(`  host heap per waiting session (bytes, incl. memory storage)`, Math.round((heap1 - heap0) / N).toString());
  add(`  checkpoint text per waiting session (bytes)`, Math.round(storage.bytes() / N).toString());
  add(`  live timers / pending callers`, `${host.timed} / ${host.pending}`);
  host.close();
  await asyncTool.stop(true);
  void pending;

  // 4. A larger crash run.
  const ref = await crashRun({ rows: 50, n: 8, kills: 0, random: mulberry32(3) });
  const crashed = await crashRun({ rows: 50, n: 8, kills: 6, random: mulberry32(9) });
  let same = 0;
  for (const [k, r] of ref.records) if (JSON.stringify(comparableRecord(r)) === JSON.stringify(comparableRecord(crashed.records.get(k)!))) same++;
  const twice = [...crashed.stored.values()].filter((n) => n > 1).length;
  add(`crash run: trajectories / kills / identical records`, `${crashed.records.size} / ${crashed.kills} / ${same}`);
  add(`  keys stored twice / second writes deduped by queue`, `${twice} / ${crashed.deduped}`);
  add(`  tool executions (ref) / call ids / re-sends`, `${crashed.executions} (${ref.executions}) / ${crashed.callIds} / ${crashed.resent}`);
  add(`  wall time with kills / without (s)`, `${(crashed.ms / 1000).toFixed(1)} / ${(ref.ms / 1000).toFixed(1)}`);
} finally {
  await tools.stop();
  await commander.close();
  await deleteByPrefix(prefix);
}
const w = Math.max(...rows.map((r) => r.what!.length));
for (const r of rows) console.log(`${r.what!.padEnd(w)}  ${r.value}`);
