import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `kill -9` of the node launcher (bin/edgeloop.mjs) must not leave its bun child running as an
// orphan (still claiming jobs): the child watches for its launcher and leaves within a few seconds.
const LAUNCHER = join(import.meta.dir, "..", "..", "bin", "edgeloop.mjs");
const redis = await requireRedis();
const prefixes: string[] = [];
const pids: number[] = [];
afterAll(async () => {
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  for (const p of prefixes) await deleteByPrefix(p);
});

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    // A zombie still answers kill 0; it has exited all the same.
    return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
};

/** The launcher's child processes (Linux /proc). */
function childrenOf(pid: number): number[] {
  const f = `/proc/${pid}/task/${pid}/children`;
  return existsSync(f) ? readFileSync(f, "utf8").trim().split(/\s+/).filter(Boolean).map(Number) : [];
}

/** Starts the launcher with `args`, waits for `ready` on its stderr or stdout, returns both pids. */
async function launch(args: string[], ready: RegExp): Promise<{ launcher: ReturnType<typeof Bun.spawn>; child: number; output: () => string }> {
  const launcher = Bun.spawn(["node", LAUNCHER, ...args], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  pids.push(launcher.pid);
  let out = "";
  const pump = async (s: ReadableStream<Uint8Array>) => {
    for await (const chunk of s) out += new TextDecoder().decode(chunk);
  };
  void pump(launcher.stdout as ReadableStream<Uint8Array>);
  void pump(launcher.stderr as ReadableStream<Uint8Array>);
  for (let i = 0; i < 1200 && !ready.test(out); i++) await Bun.sleep(50);
  expect(out).toMatch(ready);
  const kids = childrenOf(launcher.pid);
  expect(kids.length).toBe(1);
  pids.push(kids[0]!);
  return { launcher, child: kids[0]!, output: () => out };
}

async function goneWithin(pid: number, ms: number): Promise<number> {
  const t0 = Date.now();
  while (alive(pid) && Date.now() - t0 < ms) await Bun.sleep(100);
  return Date.now() - t0;
}

describe("the bun child leaves when its launcher is SIGKILLed", () => {
  test("serve", async () => {
    const { launcher, child, output } = await launch(["serve", "--port", "0"], /edgeloop serving on http/);
    expect(alive(child)).toBe(true);
    launcher.kill("SIGKILL");
    await goneWithin(child, 30_000);
    expect(alive(child)).toBe(false);
    expect(output()).toContain(`edgeloop: the launcher (pid ${launcher.pid}) is gone; stopping`);
  }, HANG_MS);

  test.skipIf(!redis)("worker (queue store): stops claiming and exits", async () => {
    const prefix = randomPrefix("orphan");
    prefixes.push(prefix);
    const { launcher, child } = await launch(["worker", "--store", REDIS_URL, "--store-prefix", prefix], /worker {5}\S+: /);
    launcher.kill("SIGKILL");
    await goneWithin(child, 30_000);
    expect(alive(child)).toBe(false);
  }, HANG_MS);

  test("a plain SIGTERM of the launcher is still forwarded: the child stops, the launcher exits 0", async () => {
    const { launcher, child } = await launch(["serve", "--port", "0"], /edgeloop serving on http/);
    // A normal SIGTERM of the launcher is forwarded: the child stops at once too.
    launcher.kill("SIGTERM");
    await goneWithin(child, 30_000);
    expect(alive(child)).toBe(false);
    expect(await launcher.exited).toBe(0);
  }, HANG_MS);
});

describe("run through npx (npm_command=exec): the CLI follows npm's lifetime", () => {
  test("`npx edgeloop serve & kill $!`: npm forwards SIGTERM to its `sh -c`, which dies alone; the launcher notices it was re-parented and stops the CLI", async () => {
    // The shape npm exec gives: npm → sh -c → node bin/edgeloop.mjs → bun. `; true` keeps sh from exec-ing node.
    const sh = Bun.spawn(["sh", "-c", `node ${LAUNCHER} serve --port 0; true`], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", npm_command: "exec" } });
    pids.push(sh.pid);
    let out = "";
    void (async () => {
      for await (const chunk of sh.stdout as ReadableStream<Uint8Array>) out += new TextDecoder().decode(chunk);
    })();
    for (let i = 0; i < 1200 && !/edgeloop serving on http/.test(out); i++) await Bun.sleep(50);
    expect(out).toMatch(/edgeloop serving on http/);
    const launcher = childrenOf(sh.pid)[0]!;
    const child = childrenOf(launcher)[0]!;
    pids.push(launcher, child);
    sh.kill("SIGTERM");
    await goneWithin(child, 30_000);
    await goneWithin(launcher, 30_000);
    expect([alive(child), alive(launcher)]).toEqual([false, false]);
  }, HANG_MS);

  test("without npm_command=exec (the bin run directly, e.g. under nohup or a supervisor) a re-parented launcher keeps serving", async () => {
    const sh = Bun.spawn(["sh", "-c", `node ${LAUNCHER} serve --port 0; true`], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", npm_command: "" } });
    pids.push(sh.pid);
    let out = "";
    void (async () => {
      for await (const chunk of sh.stdout as ReadableStream<Uint8Array>) out += new TextDecoder().decode(chunk);
    })();
    for (let i = 0; i < 1200 && !/edgeloop serving on http/.test(out); i++) await Bun.sleep(50);
    const launcher = childrenOf(sh.pid)[0]!;
    const child = childrenOf(launcher)[0]!;
    pids.push(launcher, child);
    sh.kill("SIGTERM");
    await Bun.sleep(2_000);
    expect([alive(child), alive(launcher)]).toEqual([true, true]);
  }, HANG_MS);
});
