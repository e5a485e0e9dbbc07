import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { freePort } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// GET /v1/rollouts lists batches from the store (queue mode), paged, and a restarted `serve`
// over the same Redis lists what the first one accepted.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const redis = await requireRedis();
const prefix = randomPrefix("batch-list");
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups) await c();
  await deleteByPrefix(prefix);
});

async function serve(port: number): Promise<{ url: string; stop(): Promise<void> }> {
  const p = Bun.spawn([process.execPath, MAIN, "serve", "--port", String(port), "--store", REDIS_URL, "--store-prefix", prefix], { stdout: "pipe", stderr: "pipe", env: { ...process.env, EDGELOOP_API_TOKEN: "" } });
  const stop = async () => {
    p.kill("SIGKILL");
    await p.exited;
  };
  cleanups.push(stop);
  const url = `http://127.0.0.1:${port}`;
  // A bound for a hang only: serve starts in seconds, more than 15 s on a loaded CI machine.
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline && p.exitCode === null) {
    const ok = await fetch(`${url}/health`).then((r) => r.ok, () => false);
    if (ok) return { url, stop };
    await Bun.sleep(50);
  }
  throw new Error(`serve did not start (exit ${p.exitCode}): ${await new Response(p.stderr).text().catch(() => "")}`);
}

const row = (uid: string) => ({ uid, prompt: [{ role: "user", content: `q ${uid}` }] });

test.skipIf(!redis)("queue mode: batches are listed from Redis, newest first, paged with limit and cursor, also by a restarted serve", async () => {
  const port = await freePort();
  let s = await serve(port);
  const ids: string[] = [];
  for (const uid of ["bl-a", "bl-b", "bl-c"]) {
    const r = await fetch(`${s.url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [row(uid)] }) });
    expect(r.status).toBe(202);
    ids.push(((await r.json()) as { batch_id: string }).batch_id);
    await Bun.sleep(3); // distinct started_at milliseconds
  }
  // Exactly the index entries the three batches wrote.
  const raw = rawRedis();
  cleanups.push(() => raw.quit());
  const members = await raw.zrange(`${prefix}jobs:batches`, "0", "-1");
  expect(members.map((m) => m.slice(16))).toEqual(ids);
  expect(members.every((m) => /^\d{15}:/.test(m))).toBe(true);

  await s.stop();
  s = await serve(port); // a new process: nothing in memory
  const page1 = (await (await fetch(`${s.url}/v1/rollouts?limit=2`)).json()) as { batches: { batch_id: string; done: boolean; counts: { total: number } }[]; next_cursor: string | null };
  expect(page1.batches.map((b) => b.batch_id)).toEqual([ids[2]!, ids[1]!]);
  expect(page1.batches.map((b) => b.counts.total)).toEqual([1, 1]);
  expect(page1.next_cursor).toBe(members[1]!);
  const page2 = (await (await fetch(`${s.url}/v1/rollouts?limit=2&cursor=${encodeURIComponent(page1.next_cursor!)}`)).json()) as { batches: { batch_id: string }[]; next_cursor: string | null };
  expect(page2.batches.map((b) => b.batch_id)).toEqual([ids[0]!]);
  expect(page2.next_cursor).toBeNull();
  const all = (await (await fetch(`${s.url}/v1/rollouts`)).json()) as { batches: { batch_id: string }[]; next_cursor: string | null };
  expect(all.batches.map((b) => b.batch_id)).toEqual([ids[2]!, ids[1]!, ids[0]!]);

  // A batch whose hash is gone is still listed by a process that holds it (reported lost there)…
  await raw.del(`${prefix}jobs:batch:${ids[1]}`);
  const held = (await (await fetch(`${s.url}/v1/rollouts`)).json()) as { batches: { batch_id: string }[] };
  expect(held.batches.map((b) => b.batch_id)).toEqual([ids[2]!, ids[1]!, ids[0]!]);
  // …but not by another one (expired, collected by gc), and its index entry is dropped.
  await s.stop();
  s = await serve(port);
  const after = (await (await fetch(`${s.url}/v1/rollouts?limit=2`)).json()) as { batches: { batch_id: string }[]; next_cursor: string | null };
  expect(after.batches.map((b) => b.batch_id)).toEqual([ids[2]!, ids[0]!]);
  expect(await raw.zcard(`${prefix}jobs:batches`)).toBe(2);

  const bad = await fetch(`${s.url}/v1/rollouts?cursor=nope`);
  expect(bad.status).toBe(400);
  expect(await bad.json()).toEqual({ error: { code: "invalid_input", field: "cursor", message: "cursor: must be the next_cursor of an earlier page" } });
  expect((await fetch(`${s.url}/v1/rollouts?limit=0`)).status).toBe(400);
}, HANG_MS); // a bound for a hang only: two serve starts on a loaded machine

test.skipIf(!redis)("a finished batch collected by edgeloop gc is no longer listed by the process that ran it", async () => {
  const port = await freePort();
  const s = await serve(port);
  const worker = Bun.spawn([process.execPath, MAIN, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--idle-exit", "30"], { stdout: "pipe", stderr: "pipe" });
  cleanups.push(async () => {
    worker.kill("SIGKILL");
    await worker.exited;
  });
  const r = await fetch(`${s.url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [row("bl-gc")] }) });
  expect(r.status).toBe(202);
  const id = ((await r.json()) as { batch_id: string }).batch_id;
  let done = false;
  for (let i = 0; i < 400 && !done; i++) {
    done = ((await (await fetch(`${s.url}/v1/rollouts/${id}`)).json()) as { done: boolean }).done;
    if (!done) await Bun.sleep(50);
  }
  expect(done).toBe(true);
  const listed = async () => ((await (await fetch(`${s.url}/v1/rollouts?limit=100`)).json()) as { batches: { batch_id: string }[] }).batches.map((b) => b.batch_id);
  expect(await listed()).toContain(id);
  const gc = Bun.spawnSync([process.execPath, MAIN, "gc", "--store", REDIS_URL, "--store-prefix", prefix, "--older-than", "0", "--json"], { stdout: "pipe", stderr: "pipe" });
  expect(gc.exitCode).toBe(0);
  expect((JSON.parse(gc.stdout.toString()) as { deleted: { batches: number } }).deleted.batches).toBeGreaterThanOrEqual(1);
  expect(await listed()).not.toContain(id);
  expect((await fetch(`${s.url}/v1/rollouts/${id}`)).status).toBe(404);
}, HANG_MS); // a bound for a hang only
