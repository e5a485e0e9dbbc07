import { afterAll, describe, expect, test } from "bun:test";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { MemoryEngineGate, RedisEngineGate, type EngineGate } from "../../shared/inference/engine-control.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { versionStampedClient } from "../../shared/rollout/executor.ts";
import { MemoryPolicyVersions, RedisPolicyVersions, type PolicyVersions } from "../../shared/rollout/policy-version.ts";
import type { RedisArg, RedisCommander } from "../../shared/store/redis-commander.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 25 item 5: a version set at one process is the version of every engine call another process
// dispatches after the set returned — 0 ms after, no cache window — over Redis (TCP) and Upstash (REST).
const redis = await requireRedis();
const prefix = randomPrefix("version-order");
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of closers.reverse()) await c().catch(() => {});
  if (redis) await deleteByPrefix(prefix);
});

const engine: InferenceClient = { generate: async () => ({ token_ids: [7, 8], finish_reason: "stop", num_preempted: 0, extra_fields: {} }) };
const req = { request_id: "r", routing_key: "k", prompt_ids: [1, 2], sampling_params: { max_tokens: 2 } } as unknown as GenerateRequest;

/** A commander that logs each command's name (pipelines as `pipeline:<names>`). */
function logged(c: RedisCommander, log: string[]): RedisCommander {
  return {
    exec: (cmd: RedisArg[]) => (log.push(String(cmd[0])), c.exec(cmd)),
    pipeline: (cs: RedisArg[][]) => (log.push(`pipeline:${cs.map((x) => String(x[0])).join(",")}`), c.pipeline(cs)),
    close: () => c.close(),
  };
}

type Transport = "redis" | "upstash";
async function commander(t: Transport): Promise<RedisCommander> {
  if (t === "redis") {
    const c = new IoRedisCommander(REDIS_URL);
    closers.push(() => c.close());
    return c;
  }
  const token = crypto.randomUUID();
  const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
  closers.push(() => bridge.stop());
  return new UpstashCommander({ url: bridge.url, token, retries: 0 });
}

describe.skipIf(!redis)("a version set at process A stamps every call process B dispatches after it", () => {
  // Process B as `edgeloop serve` / `worker` wire it (the gate's admission reads the policy), as a gate that does
  // not (the uncached read), and with no gate (the Durable Objects' path): each on its own connections.
  const shapes: [string, Transport, (c: RedisCommander, p: string, policy: RedisPolicyVersions) => EngineGate | undefined][] = [
    ["gate reads the policy (serve/worker)", "redis", (c, p, policy) => new RedisEngineGate(c, { prefix: p, policyKey: policy.key })],
    ["gate without policyKey: uncached current()", "redis", (c, p) => new RedisEngineGate(c, { prefix: p })],
    ["no gate (Durable Object): uncached current()", "redis", () => undefined],
    ["Upstash REST, gate reads the policy", "upstash", (c, p, policy) => new RedisEngineGate(c, { prefix: p, policyKey: policy.key })],
    ["Upstash REST, no gate (Durable Object)", "upstash", () => undefined],
  ];
  for (const [name, transport, gateOf] of shapes) {
    test(`${name}: 200 alternating versions, each call stamped with the one set just before`, async () => {
      const p = `${prefix}${transport}-${name.length}:`;
      const a = new RedisPolicyVersions(await commander(transport), { prefix: p });
      const bLog: string[] = [];
      const bPolicy = new RedisPolicyVersions(logged(await commander(transport), bLog), { prefix: p });
      const gate = gateOf(logged(await commander(transport), bLog), p, bPolicy);
      const b = versionStampedClient({ client: engine, policy: bPolicy, ...(gate ? { gate } : {}) }, "batch-version");
      // None set yet: the batch's version.
      expect((await b.generate(req)).extra_fields?.model_version).toBe("batch-version");
      const stamped: unknown[] = [];
      const want: string[] = [];
      for (let i = 0; i < 200; i++) {
        const v = i % 2 === 0 ? "step-a" : "step-b";
        await a.set(v);
        want.push(v);
        stamped.push((await b.generate(req)).extra_fields?.model_version);
      }
      expect(stamped).toEqual(want);
      // Cost on B's call path: one command per call (the admission EVAL, or the version read without a gate);
      // a gate that does not read the policy needs the read on top (two).
      const onPath = bLog.filter((x) => !x.startsWith("pipeline:"));
      const per = gate && name.includes("without") ? ["EVAL", "HMGET"] : gate ? ["EVAL"] : ["HMGET"];
      expect(onPath).toEqual(Array.from({ length: 201 }, () => per).flat());
    });
  }

  test("a pause in between: the call held by the closed gate is stamped with the version set before the gate opened", async () => {
    const p = `${prefix}held:`;
    const a = new RedisPolicyVersions(await commander("redis"), { prefix: p });
    const aGate = new RedisEngineGate(await commander("redis"), { prefix: p });
    const bPolicy = new RedisPolicyVersions(await commander("redis"), { prefix: p });
    const b = versionStampedClient({ client: engine, policy: bPolicy, gate: new RedisEngineGate(await commander("redis"), { prefix: p, policyKey: bPolicy.key, pollMs: 2 }) }, null);
    await a.set("v1");
    expect((await b.generate(req)).extra_fields?.model_version).toBe("v1");
    await aGate.close("abort");
    const held = b.generate(req);
    await a.set("v2");
    await aGate.open();
    expect((await held).extra_fields?.model_version).toBe("v2");
  });

  test("memory store (one process): the version set is the next call's, with the memory gate and without", async () => {
    const policy: PolicyVersions = new MemoryPolicyVersions();
    for (const gate of [new MemoryEngineGate(), undefined]) {
      const b = versionStampedClient({ client: engine, policy, ...(gate ? { gate } : {}) }, null);
      for (const v of ["m1", "m2", "m1", 3]) {
        await policy.set(v);
        expect((await b.generate(req)).extra_fields?.model_version).toBe(v);
      }
    }
  });

  test("two runtimes on one Redis prefix (buildRuntime, as serve and an inline worker): every turn of a batch B runs right after A's set records A's version", async () => {
    const p = `${prefix}rt:`;
    const flags = { store: REDIS_URL, storePrefix: p, n: 1, seed: 7, maxModelLen: 4096 };
    const rtA = await buildRuntime(flags);
    closers.push(() => rtA.close());
    const rtB = await buildRuntime(flags);
    closers.push(() => rtB.close());
    const got: unknown[] = [];
    const want: unknown[] = [];
    for (let i = 0; i < 40; i++) {
      const v = i % 2 === 0 ? "rt-a" : "rt-b";
      await rtA.service.policy.set(v);
      const b = rtB.service.submit({ rows: [{ ...ROWS[i % ROWS.length]!, uid: `rt${i}` }], global_steps: i, model_version: "batch-version", validate: false });
      await b.run.run();
      const [r] = b.run.records();
      expect(r!.error).toBeNull();
      const turns = r!.extra_fields.model_versions as unknown[];
      expect(turns.length).toBeGreaterThan(0);
      got.push(turns, r!.extra_fields.token_versions);
      want.push(turns.map(() => v), [[0, v]]);
    }
    expect(got).toEqual(want);
  }, HANG_MS);
});
