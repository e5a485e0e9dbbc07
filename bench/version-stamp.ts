/**
 * Cost of stamping an engine call with the policy version (issue 25 item 5),
 * over the Redis engine gate as `edgeloop serve` / `worker` wire it, against
 * a zero-latency engine (an inner client that answers at once), so every
 * microsecond and every Redis command is the gate's and the stamp's:
 * - `gate only`: admission EVAL, no stamp (the floor);
 * - `gate + current()`: the version from `RedisPolicyVersions.current()` after admission;
 * - `gate (policyKey) + admission`: the version the admission EVAL itself read
 *   (the gate built with `policyKey`, the stamp from `admission.policy`);
 * - `gate + HMGET per call`: an explicit uncached read after admission (the
 *   other design weighed: one more round trip per call).
 * Per variant: sequential calls (latency µs per call) and 64 concurrent
 * (µs per call of the batch), CPU µs per call (`process.cpuUsage()`, this
 * process: Redis's own CPU is not in it) and Redis commands per call on the
 * call's path (the coalesced removals counted apart). Medians of `--runs`.
 *
 *   bun bench/version-stamp.ts [--runs 5] [--calls 2000]
 */
import { IoRedisCommander } from "../infra/redis/ioredis-commander.ts";
import { GatedClient, RedisEngineGate, type GateAdmission } from "../shared/inference/engine-control.ts";
import type { InferenceClient } from "../shared/inference/types.ts";
import { RedisPolicyVersions } from "../shared/rollout/policy-version.ts";
import type { RedisArg, RedisCommander } from "../shared/store/redis-commander.ts";
import { arg, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "5"));
const CALLS = Number(arg("--calls", "2000"));
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefix = `bench:version-stamp:${crypto.randomUUID().slice(0, 8)}:`;

const base = new IoRedisCommander(REDIS_URL);
const counts = { path: 0, removals: 0 };
const counting: RedisCommander = {
  exec: (cmd: RedisArg[]) => (counts.path++, base.exec(cmd)),
  pipeline: (cs: RedisArg[][]) => ((counts.removals += cs.length), base.pipeline(cs)),
  close: () => base.close(),
};
const engine: InferenceClient = { generate: async () => ({ token_ids: [1, 2, 3], finish_reason: "stop", num_preempted: 0, extra_fields: {} }) };
const req = { prompt_ids: [1, 2, 3], sampling_params: { max_tokens: 3 } } as never;

const policy = new RedisPolicyVersions(counting, { prefix });
await policy.set("step-1");
const policyKey = policy.key;
type Variant = { name: string; client: GatedClient };
const variants: Variant[] = [
  { name: "gate only", client: new GatedClient(engine, new RedisEngineGate(counting, { prefix })) },
  { name: "gate + current()", client: new GatedClient(engine, new RedisEngineGate(counting, { prefix }), { version: async () => (await policy.current())?.version ?? null }) },
  {
    name: "gate (policyKey) + admission",
    client: new GatedClient(engine, new RedisEngineGate(counting, { prefix, policyKey }), {
      version: async (at: GateAdmission) => (at?.policy !== undefined ? at.policy : await policy.current())?.version ?? null,
    }),
  },
  {
    name: "gate + HMGET per call",
    client: new GatedClient(engine, new RedisEngineGate(counting, { prefix }), {
      version: async () => {
        const [cur] = (await counting.exec(["HMGET", policyKey, "current", "seq"])) as (string | null)[];
        return cur == null ? null : (JSON.parse(cur) as string | number);
      },
    }),
  },
];

/** One run of `CALLS` calls, `concurrency` at a time: wall µs per call, CPU µs per call, commands per call on the path. */
async function once(v: Variant, concurrency: number): Promise<[number, number, number]> {
  let next = 0;
  counts.path = 0;
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next++ < CALLS) {
        const out = await v.client.generate(req);
        if (out.extra_fields?.model_version !== undefined && out.extra_fields.model_version !== "step-1") throw new Error(`${v.name}: stamped ${String(out.extra_fields.model_version)}`);
      }
    }),
  );
  const c = process.cpuUsage(c0);
  return [((performance.now() - t0) * 1000) / CALLS, (c.user + c.system) / CALLS, counts.path / CALLS];
}

// One warm-up run of every variant (JIT, connections), then the runs interleaved variant by variant so that drift
// on this shared machine falls on all of them alike.
for (const v of variants) for (const c of [1, 64]) await once(v, c);
const samples = new Map(variants.map((v) => [v.name, { 1: [] as [number, number, number][], 64: [] as [number, number, number][] }]));
for (let r = 0; r < RUNS; r++) for (const v of variants) for (const c of [1, 64] as const) samples.get(v.name)![c].push(await once(v, c));
const med = (xs: [number, number, number][], i: number) => median(xs.map((x) => x[i]!)).toFixed(i === 2 ? 2 : 1);
const rows: string[][] = [["variant", "sequential µs/call", "64 concurrent µs/call", "CPU µs/call (seq)", "CPU µs/call (64)", "commands/call on the path"]];
for (const v of variants) {
  const s = samples.get(v.name)!;
  rows.push([v.name, med(s[1], 0), med(s[64], 0), med(s[1], 1), med(s[64], 1), `${med(s[1], 2)} / ${med(s[64], 2)}`]);
}
printTable(`version stamp over the Redis gate (${CALLS} calls a run, medians of ${RUNS})`, rows);
await base.exec(["DEL", policyKey, `${prefix}engine:gate`, `${prefix}engine:inflight`, `${prefix}engine:starting`]);
await base.close();
