import { afterAll, describe, expect, test } from "bun:test";
import { createServer, type Server as NetServer } from "node:net";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue } from "../../shared/jobs/job-queue.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { createAgentExecutor } from "../../shared/rollout/executor.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { ToolSpec } from "../../shared/schema/index.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../../shared/store/redis-commander.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { depsFor, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const redis = await requireRedis();

/** A TCP server that accepts each connection and closes it at once, mid-request (counts connections). */
function closingServer(): Promise<{ url: string; conns: () => number; stop: () => void }> {
  let n = 0;
  const server: NetServer = createServer((sock) => {
    n++;
    sock.once("data", () => sock.destroy());
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      resolve({ url: `http://127.0.0.1:${port}`, conns: () => n, stop: () => server.close() });
    });
  });
}

describe("tool faults become error observations after retries", () => {
  test("a tool that closes the connection mid-request: retried, then an error result", async () => {
    const srv = await closingServer();
    try {
      const spec = ToolSpec.parse({ name: "calc", url: `${srv.url}/tools/calc`, max_retries: 2, timeout_ms: 1000, schema: { function: { name: "calc" } } });
      const client = new WebhookToolClient([spec], { retryMinTimeoutMs: 1, retryMaxTimeoutMs: 5 });
      const r = await client.call({ name: "calc", arguments: {}, key: "k_0_0", turn: 1, index: 0 });
      expect(r.ok).toBe(false);
      expect(r.call_id).toBe("k_0_0:1:0");
      expect(r.attempts).toBe(3);
      expect(r.content).toStartWith("Error executing tool 'calc': ");
      expect(srv.conns()).toBe(3);
    } finally {
      srv.stop();
    }
  });

  test("in a trajectory: the failed call is an error observation, counted in tool_errors, and the loop goes on", async () => {
    const srv = await closingServer();
    try {
      const { deps } = await depsFor(srv.url);
      const config = parseAppConfig({ rollout: { n: 1, max_model_len: 4096 } });
      const service = new RolloutService({ config, store: new MemoryTransferQueue(), executorFor: (r, b) => createAgentExecutor(deps, r, b) });
      const { run } = service.submit({ rows: [{ ...ROWS[0], uid: "toolfault" }], global_steps: -1, model_version: null, validate: false });
      await run.run();
      const rec = run.records()[0]!;
      expect(rec.error).toBeNull();
      expect(rec.extra_fields.tool_errors).toBe(1);
      expect(rec.num_turns).toBe(4);
      expect(rec.response_mask.includes(0)).toBe(true);
    } finally {
      srv.stop();
    }
  }, HANG_MS);
});

/** A commander whose next `failures` commands fail as a dropped connection does (ioredis' message). */
class FlakyCommander implements RedisCommander {
  failures = 0;
  failed = 0;
  constructor(private readonly inner: RedisCommander) {}
  private trip(): void {
    if (this.failures > 0) {
      this.failures--;
      this.failed++;
      throw new Error("Connection is closed.");
    }
  }
  async exec(cmd: RedisArg[]): Promise<RedisReply> {
    this.trip();
    return this.inner.exec(cmd);
  }
  async pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    this.trip();
    return this.inner.pipeline(cmds);
  }
  async execBlocking(cmd: RedisArg[]): Promise<RedisReply> {
    this.trip();
    return this.inner.execBlocking!(cmd);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

const output: AgentLoopOutput = {
  prompt_ids: [1, 2],
  response_ids: [3],
  response_mask: [1],
  response_logprobs: [-0.5],
  reward_score: null,
  num_turns: 2,
  truncated: false,
  finish_reason: "stop",
  metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
  extra_fields: {},
};

describe.skipIf(!redis)("store faults", () => {
  const prefix = randomPrefix("store-faults");
  const closers: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const c of closers) await c().catch(() => {});
    await deleteByPrefix(prefix);
  });

  test("Redis connection loss during claim, record write, event and ack: retried with backoff; the record is stored once and acked", async () => {
    const inner = new IoRedisCommander(REDIS_URL);
    const flaky = new FlakyCommander(inner);
    const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
    closers.push(() => inner.close(), () => store.close());
    const storeFlaky = new FlakyCommander(new IoRedisCommander(REDIS_URL));
    // The records go through a transfer queue whose commander drops its first two writes.
    const { RedisTransferQueue } = await import("../../shared/store/redis-transfer-queue.ts");
    const writes = new RedisTransferQueue(storeFlaky, { prefix });
    closers.push(() => writes.close());
    const jobs = new JobQueue(flaky, { prefix, leaseMs: 5_000 });
    const config = parseAppConfig({ rollout: { n: 2 } });
    const executorFor = () => ({ agentNameFor: () => "fake", run: async () => ({ agentName: "fake", outputs: [output] }) });
    const service = new RolloutService({ config, store, executorFor, jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const { run, keys } = await service.accept({ rows: [{ prompt: [{ role: "user", content: "a" }], uid: "flaky" }], global_steps: -1, model_version: null, validate: false });
    flaky.failures = 3;
    storeFlaky.failures = 2;
    const worker = new JobWorker({ model: null, jobs, store: writes, executorFor, consumer: "flaky-w", concurrency: 2, idleExitMs: 1_500, blockMs: 100 });
    const summary = await worker.run();
    expect(flaky.failed).toBe(3);
    expect(storeFlaky.failed).toBe(2);
    expect(summary).toMatchObject({ completed: 2, failed: 0, exit: "idle" });
    await run.run();
    expect(run.stats().counts).toEqual({ total: 2, pending: 0, running: 0, finished: 2, reused: 0, records: 2, ok: 2, failed: 0, truncated: 0 });
    for (const k of keys) expect((await store.get(k))!.response_ids).toEqual([3]);
    expect(await store.groupStatus("flaky")).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 0 });
  }, HANG_MS);

  test("a full store (Redis OOM) or a full job queue: POST /v1/rollouts answers 503 with Retry-After, nothing enqueued", async () => {
    const oom: RedisCommander = {
      exec: async (cmd) => {
        if (cmd[0] === "XADD" || cmd[0] === "EVALSHA" || cmd[0] === "EVAL") throw new Error("OOM command not allowed when used memory > 'maxmemory'.");
        return cmd[0] === "XLEN" ? 0 : "OK";
      },
      pipeline: async (cmds) => cmds.map(() => new Error("OOM command not allowed when used memory > 'maxmemory'.")),
      close: async () => {},
    };
    const jobs = new JobQueue(oom, { prefix });
    const service = new RolloutService({ config: parseAppConfig({}), store: new MemoryTransferQueue(), executorFor: () => ({ agentNameFor: () => "x", run: () => Promise.reject(new Error("x")) }), jobs });
    const app = createRolloutsApp({ service });
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [{ prompt: [{ role: "user", content: "a" }] }] }) });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await res.json()).toEqual({ error: { code: "store_full", message: "internal error" } });
    expect(service.batchIds()).toEqual([]);

    const fullCmd = new IoRedisCommander(REDIS_URL);
    closers.push(() => fullCmd.close());
    const full = new RolloutService({ config: parseAppConfig({}), store: createRedisTransferQueue({ url: REDIS_URL, prefix }), executorFor: () => ({ agentNameFor: () => "x", run: () => Promise.reject(new Error("x")) }), jobs: new JobQueue(fullCmd, { prefix: `${prefix}full:`, maxPending: 1 }) });
    closers.push(() => full.store.close(), async () => full.close());
    const fullApp = createRolloutsApp({ service: full });
    const post = (rows: unknown[]) => fullApp.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    // Larger than --max-pending: it would never fit, so a 413 that states the limit (no Retry-After).
    const tooBig = await post([{ prompt: [{ role: "user", content: "a" }] }, { prompt: [{ role: "user", content: "b" }] }]);
    expect(tooBig.status).toBe(413);
    expect(tooBig.headers.get("retry-after")).toBeNull();
    expect(await tooBig.json()).toEqual({
      error: { code: "batch_too_large", field: "rows", message: "batch too large for the job queue: it has 2 trajectories to run and serve accepts at most 1 pending jobs (--max-pending 1); split the batch or raise --max-pending" },
    });
    expect((await post([{ prompt: [{ role: "user", content: "a" }] }])).status).toBe(202);
    const res2 = await post([{ prompt: [{ role: "user", content: "c" }] }]);
    expect(res2.status).toBe(503);
    expect(res2.headers.get("retry-after")).toBe("1");
    expect((await res2.json()).error.code).toBe("queue_full");
  });
});
