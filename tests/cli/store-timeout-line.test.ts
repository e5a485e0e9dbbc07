import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";

// The outage line says how long the process will wait: "until it answers" only when nothing bounds
// the wait; with --store-timeout it names the bound.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups) await c();
});

test("IoRedisCommander names the --store-timeout bound in its outage line", async () => {
  for (const [opts, line] of [
    [{}, "Redis redis://127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1 (reconnecting, until it answers)"],
    [{ storeTimeoutS: 5 }, "Redis redis://127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1 (reconnecting, until it answers or for at most 5 s (--store-timeout))"],
  ] as const) {
    const seen: string[] = [];
    const c = new IoRedisCommander("redis://127.0.0.1:1", { ...opts, onError: (m) => seen.push(m) });
    await waitFor(() => seen.length > 0, "the outage line", HANG_MS, 20);
    await c.close();
    expect(seen[0]).toBe(line);
  }
});

test("serve --store-timeout 30: the outage line printed when Redis goes away names the bound", async () => {
  const redis: PrivateRedis = await privateRedis();
  cleanups.push(() => redis.dispose());
  await redis.start();
  const p = Bun.spawn([process.execPath, MAIN, "serve", "--port", "0", "--store", redis.url, "--store-prefix", "stl:", "--store-timeout", "30"], { stdout: "pipe", stderr: "pipe" });
  cleanups.push(() => p.kill("SIGKILL"));
  let err = "";
  void (async () => {
    for await (const chunk of p.stderr as ReadableStream<Uint8Array>) err += new TextDecoder().decode(chunk);
  })();
  // serve's start (the model load) took over 10 s on a loaded CI machine: wait for its banner line, not a guess.
  await waitFor(() => err.includes("auth "), "serve's banner", HANG_MS, 50);
  await redis.stop();
  await waitFor(() => err.includes("reconnecting"), "the outage line after Redis stopped", HANG_MS, 50);
  const lines = err.split("\n").filter((l) => l.includes("reconnecting"));
  expect(lines.length).toBeGreaterThanOrEqual(1);
  for (const l of lines) expect(l).toMatch(/\(reconnecting, until it answers or for at most 30 s \(--store-timeout\)\)$/);
  expect(err).not.toContain("(reconnecting, until it answers)");
  for (const l of lines) expect(l).toStartWith(`edgeloop: Redis ${redis.url}: `);
}, HANG_MS);
