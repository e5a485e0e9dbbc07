import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { JobWorker, type WorkerSummary } from "../../shared/jobs/job-worker.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { waitFor } from "../helpers/wait.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Queue mode (serve enqueues, a worker runs each job as a durable session in Redis) with a sandbox per trajectory
// (`create: start`): a cancelled batch releases its running trajectories' sandboxes as `cancelled`, an over-sampled
// batch's surplus as `surplus` — counted by the store's release counters and by the provider's release reasons.
const hasRedis = await requireRedis();
const ROOT = join(import.meta.dir, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-lease-reasons-"));
const prefixes: string[] = [];
const runtimes: Runtime[] = [];
let provider: SandboxProvider;
let sim: RunningSimEngine;

const notes = readFileSync(join(ROOT, "examples", "sandbox-notes.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
/** A row answered at once (no tool call): its group completes long before the two-tool rows' groups. */
const quick = { ...notes[0]!, prompt: [{ role: "user", content: "Answer at once: say 6." }], extra_info: { index: 9, sandbox_kwargs: { task: "quick" } } };

beforeAll(async () => {
  provider = startSandboxProvider({ port: 0 });
  const script = JSON.parse(readFileSync(join(ROOT, "examples", "policy-sandbox.json"), "utf8")) as { rules: unknown[] };
  script.rules.unshift({ when: "Answer at once: say 6.", turns: ["#### 6"] });
  // 20 ms per token: a two-tool trajectory decodes for seconds, the quick one for a few tens of ms.
  sim = await startSimEngine({ script: script as never, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 20 } });
  const tools = JSON.parse(readFileSync(join(ROOT, "examples", "sandbox-tools.json"), "utf8").replaceAll("http://127.0.0.1:8125/", `${provider.url}/`));
  writeFileSync(join(dir, "tools.json"), JSON.stringify({ ...tools, sandbox: { ...tools.sandbox, create: "start", max_creates_per_s: 100, create_burst: 10 } }));
});
afterAll(async () => {
  for (const r of runtimes) await r.close();
  await sim?.stop();
  await provider?.stop();
  for (const p of prefixes) await deleteByPrefix(p);
  rmSync(dir, { recursive: true, force: true });
});

async function queueMode(prefix: string): Promise<{ api: Runtime; work: () => Promise<WorkerSummary>; counters: () => Promise<Record<string, number>> }> {
  prefixes.push(prefix);
  const flags = { store: REDIS_URL, storePrefix: prefix, engine: sim.urls[0]!, tools: join(dir, "tools.json"), n: 2, seed: 5, maxModelLen: 4096 };
  const api = await buildRuntime(flags, { jobs: "queue" });
  runtimes.push(api);
  const worker = await buildRuntime(flags);
  runtimes.push(worker);
  const work = () =>
    new JobWorker({ model: null, jobs: worker.jobs!, store: worker.batchStore, executorFor: worker.executorFor, consumer: "w1", concurrency: 8, idleExitMs: 1_000, blockMs: 100, cancelPollMs: 50 }).run();
  const counters = async () => {
    const c = new IoRedisCommander(REDIS_URL);
    try {
      return (await new RedisLeaseStore(c, { prefix }).stats()).counters;
    } finally {
      await c.close();
    }
  };
  return { api, work, counters };
}

describe.skipIf(!hasRedis)("queue mode: a lease's release reason", () => {
  test("a batch cancelled while its 6 trajectories run: 6 sandboxes released as cancelled, none live", async () => {
    const before = provider.stats();
    const { api, work, counters } = await queueMode(randomPrefix("lease-cancel"));
    const { batch_id, keys } = await api.service.accept(RolloutRequest.parse({ rows: notes }));
    expect(keys).toHaveLength(6);
    const worker = work();
    await waitFor(() => provider.stats().live - before.live === 6, "6 sandboxes live", 60_000);
    await api.service.cancel(batch_id);
    const summary = await worker;
    expect(summary).toMatchObject({ claimed: 6, cancelled: 6, completed: 0, failed: 0 });
    const after = provider.stats();
    expect(after.live).toBe(before.live);
    expect(after.created - before.created).toBe(6);
    expect(after.destroyed_released - before.destroyed_released).toBe(6);
    expect((after.releases_by_reason.cancelled ?? 0) - (before.releases_by_reason.cancelled ?? 0)).toBe(6);
    const c = await counters();
    expect(c["released:cancelled"]).toBe(6);
    expect(Object.keys(c).filter((k) => k.startsWith("released:")).sort()).toEqual(["released:cancelled"]);
  }, HANG_MS);

  test("an over-sampled batch (target 1 group of 3): the quick group's 2 sandboxes released as finished, the 4 still running as surplus", async () => {
    const before = provider.stats();
    const { api, work, counters } = await queueMode(randomPrefix("lease-surplus"));
    const { keys, run } = await api.service.accept(RolloutRequest.parse({ rows: [quick, notes[1], notes[2]], target_groups: 1 }));
    expect(keys).toHaveLength(6);
    const summary = await work();
    await run.run();
    expect(summary).toMatchObject({ claimed: 6, completed: 2, surplus: 4, failed: 0 });
    const after = provider.stats();
    expect(after.live).toBe(before.live);
    expect(after.created - before.created).toBe(6);
    expect((after.releases_by_reason.finished ?? 0) - (before.releases_by_reason.finished ?? 0)).toBe(2);
    expect((after.releases_by_reason.surplus ?? 0) - (before.releases_by_reason.surplus ?? 0)).toBe(4);
    const c = await counters();
    expect({ finished: c["released:finished"], surplus: c["released:surplus"] }).toEqual({ finished: 2, surplus: 4 });
  }, HANG_MS);
});
