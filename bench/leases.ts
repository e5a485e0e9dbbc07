/**
 * Sandbox lease bookkeeping (issue 29): `npm run bench -- leases`.
 *
 * 1. Per trajectory: store round trips and CPU of a lease's whole life
 *    (acquire → create → confirm → two tool calls in the sandbox → release),
 *    on the memory store and on Redis (`REDIS_URL`, a random prefix deleted
 *    after), against the example provider on loopback in this process. The
 *    CPU is the process's (edgeloop's bookkeeping plus the provider's HTTP
 *    handling of create/release); "tools only" runs the same two tool calls
 *    without a lifecycle, so the difference is what a lease adds.
 * 2. Peak creations per second under the global limiter: `--creates` (default
 *    300) trajectories ask for a sandbox at once from two managers sharing
 *    one Redis lease store (two processes' worth), with `max_creates_per_s`
 *    20 and burst 1; the provider counts its creates per second.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { IoRedisCommander } from "../infra/redis/ioredis-commander.ts";
import { startSandboxProvider } from "../infra/sandbox/provider.ts";
import { SandboxSpec } from "../shared/schema/index.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../shared/store/redis-commander.ts";
import { MemoryLeaseStore, type LeaseStore } from "../shared/tools/lease-store.ts";
import { RedisLeaseStore } from "../shared/tools/redis-lease-store.ts";
import { LeasedToolExecutor, SandboxLeases } from "../shared/tools/sandbox-leases.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../shared/tools/webhook-tool-client.ts";
import { arg, median, printTable } from "./util.ts";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const TRAJECTORIES = Number(arg("--trajectories", "400"));
const CREATES = Number(arg("--creates", "300"));

/** A commander that counts round trips (one per exec, one per pipeline) and the bytes of their arguments. */
class CountingCommander implements RedisCommander {
  trips = 0;
  bytes = 0;
  constructor(private readonly inner: RedisCommander) {}
  exec(cmd: RedisArg[]): Promise<RedisReply> {
    this.trips++;
    for (const a of cmd) this.bytes += String(a).length;
    return this.inner.exec(cmd);
  }
  pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    this.trips++;
    for (const c of cmds) for (const a of c) this.bytes += String(a).length;
    return this.inner.pipeline(cmds);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

const provider = startSandboxProvider({ port: 0 });
const toolsText = readFileSync(join(import.meta.dir, "..", "infra", "sandbox", "tools.example.json"), "utf8");
const tools = new WebhookToolClient(parseToolsFile(toolsText, { vars: { port: provider.port } }).tools, { retryMinTimeoutMs: 1 });
const spec = (extra: Record<string, unknown> = {}) =>
  SandboxSpec.parse({ create_url: `${provider.url}/sandboxes/create`, release_url: `${provider.url}/sandboxes/release`, ttl_s: 60, max_creates_per_s: 100_000, create_burst: 100_000, max_live: 100_000, ...extra });

/** Runs `n` trajectories' lease lives 8 at a time; returns CPU µs per trajectory and wall ms per trajectory. */
async function lives(n: number, tag: string, withLease: boolean, store: LeaseStore): Promise<{ cpuUs: number; wallMs: number }> {
  const leases = new SandboxLeases(spec(), store, { trajectoryDeadlineS: 600 });
  const exec = withLease ? new LeasedToolExecutor(tools, leases) : tools;
  const run = async (i: number) => {
    const key = `${tag}${i}_0_0`;
    const base = { key, turn: 1, index: 0, sandbox_fresh: true };
    // Without a lifecycle the example's sandbox tools refuse (no sandbox id): the same two HTTP calls, answered 400.
    await exec.call({ ...base, name: "sbx_write", arguments: { path: "a.txt", content: "hello" } });
    await exec.call({ ...base, turn: 2, sandbox_fresh: false, name: "sbx_read", arguments: { path: "a.txt" } });
    if (withLease) await leases.release(key, "finished");
  };
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < n; i += 8) await Promise.all(Array.from({ length: Math.min(8, n - i) }, (_, j) => run(i + j)));
  const c = process.cpuUsage(c0);
  return { cpuUs: (c.user + c.system) / n, wallMs: (performance.now() - t0) / n };
}

const rows: string[][] = [["store", "lifecycle", "store round trips / trajectory", "store bytes sent / trajectory", "CPU µs / trajectory", "wall ms / trajectory (8 at once)"]];
const prefix = `bench-leases:${crypto.randomUUID().slice(0, 8)}:`;
const commander = new CountingCommander(new IoRedisCommander(REDIS_URL));
try {
  // Warm-up (JIT, connections), not counted.
  await lives(50, "warm", true, new MemoryLeaseStore());
  await lives(50, "warmr", true, new RedisLeaseStore(commander, { prefix }));
  const plain = await lives(TRAJECTORIES, "plain", false, new MemoryLeaseStore());
  rows.push(["none", "tools only", "0", "0", plain.cpuUs.toFixed(0), plain.wallMs.toFixed(2)]);
  const mem = await lives(TRAJECTORIES, "mem", true, new MemoryLeaseStore());
  rows.push(["memory", "lease", "0", "0", mem.cpuUs.toFixed(0), mem.wallMs.toFixed(2)]);
  commander.trips = 0;
  commander.bytes = 0;
  const red = await lives(TRAJECTORIES, "red", true, new RedisLeaseStore(commander, { prefix }));
  rows.push(["redis", "lease", (commander.trips / TRAJECTORIES).toFixed(2), (commander.bytes / TRAJECTORIES).toFixed(0), red.cpuUs.toFixed(0), red.wallMs.toFixed(2)]);
  printTable(`lease bookkeeping per trajectory (${TRAJECTORIES} trajectories; create, 2 tool calls, release; provider in this process)`, rows);

  // 2. The global limiter: two managers (two processes' worth) share one Redis store.
  // A provider of its own: its per-second counts are the limiter's creates only.
  const lp = startSandboxProvider({ port: 0 });
  const limited = SandboxSpec.parse({ create_url: `${lp.url}/sandboxes/create`, release_url: `${lp.url}/sandboxes/release`, ttl_s: 60, max_creates_per_s: 20, create_burst: 1, max_live: 100_000, create_timeout_ms: 120_000 });
  const store = new RedisLeaseStore(commander, { prefix: `${prefix}lim:` });
  const a = new SandboxLeases(limited, store, { trajectoryDeadlineS: 600 });
  const b = new SandboxLeases(limited, store, { trajectoryDeadlineS: 600 });
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CREATES }, (_, i) => (i % 2 ? a : b).ensure(`lim${i}_0_0`, {}, { fresh: true })));
  const secs = (performance.now() - t0) / 1000;
  const st = lp.stats();
  const made = st.created;
  const perSecond = st.creates_per_second;
  await Promise.all(Array.from({ length: CREATES }, (_, i) => (i % 2 ? a : b).release(`lim${i}_0_0`, "finished")));
  await lp.stop();
  printTable(`global create limiter (${CREATES} creates at once from 2 managers sharing one Redis store; max_creates_per_s 20, burst 1)`, [
    ["figure", "value"],
    ["sandboxes created", String(made)],
    ["seconds to create all", secs.toFixed(1)],
    ["mean creates/s", (made / secs).toFixed(1)],
    ["peak creates in any 1 s window (provider clock)", String(st.peak_creates_1s)],
    ["configured limit per s (+ burst 1)", "20"],
    ["creates per clock second", perSecond.map((s) => s.count).join(", ")],
  ]);
} finally {
  const c = new IoRedisCommander(REDIS_URL);
  let cursor = "0";
  do {
    const [next, keys] = (await c.exec(["SCAN", cursor, "MATCH", `${prefix}*`, "COUNT", "1000"])) as [string, string[]];
    cursor = next;
    if (keys.length) await c.exec(["UNLINK", ...keys]);
  } while (cursor !== "0");
  await c.close();
  await commander.close();
  await provider.stop();
}
