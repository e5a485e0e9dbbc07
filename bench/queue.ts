/**
 * Transfer-queue benchmark (issue 5): `put` throughput and bytes stored per
 * token for N trajectories of T tokens (default 10,000 × 2,048: 1,024 prompt
 * + 1,024 response tokens with mask and log-probs) on every adapter, beside a
 * raw pipelined baseline (ioredis pipeline of SETs writing the same encoded
 * bytes). Also the two decisions it backs: token-array encoding (base64 of
 * little-endian bytes vs JSON arrays) and the TCP client (Bun `RedisClient`
 * vs ioredis). Cleans its keys up.
 *
 *   bun bench/queue.ts [--n 10000] [--tokens 2048] [--concurrency 64]
 */
import { RedisClient } from "bun";
import IORedis from "ioredis";
import { createRedisTransferQueue } from "../infra/redis/redis-transfer-queue.ts";
import { startUpstashBridge } from "../infra/upstash-bridge/upstash-bridge.ts";
import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { MemoryTransferQueue } from "../shared/store/memory-transfer-queue.ts";
import { decodeRecord, encodedFields, encodeRecord, validateRecord } from "../shared/store/record-codec.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../shared/store/redis-commander.ts";
import { RedisTransferQueue } from "../shared/store/redis-transfer-queue.ts";
import type { TransferQueue } from "../shared/store/types.ts";
import { createUpstashTransferQueue } from "../shared/store/upstash-transfer-queue.ts";
import { arg, median, printTable, syntheticRecord } from "./util.ts";

const N = Number(arg("--n", "10000"));
const T = Number(arg("--tokens", "2048"));
const CONC = Number(arg("--concurrency", "64"));
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const RUN = `bench:queue:${crypto.randomUUID().slice(0, 8)}:`;

/** Bun's built-in client behind the command interface (bench only: ioredis was chosen for infra/redis). */
class BunRedisCommander implements RedisCommander {
  private readonly c: RedisClient;
  constructor(url: string) {
    this.c = new RedisClient(url);
  }
  exec(cmd: RedisArg[]): Promise<RedisReply> {
    const [name, ...args] = cmd as string[];
    return this.c.send(name!, args) as Promise<RedisReply>;
  }
  pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    return Promise.all(cmds.map((c) => this.exec(c).catch((e: Error) => e)));
  }
  async close(): Promise<void> {
    this.c.close();
  }
}

function makeRecords(n: number, tokens: number): TrajectoryRecord[] {
  const half = tokens >> 1;
  const out: TrajectoryRecord[] = [];
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const prompt = Array.from({ length: half }, () => Math.floor(rnd() * 151000));
  for (let i = 0; i < n; i++) {
    const uid = `b${Math.floor(i / 8)}`;
    out.push(syntheticRecord(uid, i % 8, prompt, half, rnd));
  }
  return out;
}

async function timed(fn: () => Promise<void>): Promise<number> {
  const t = performance.now();
  await fn();
  return (performance.now() - t) / 1000;
}

async function parallel<T>(items: T[], conc: number, fn: (x: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: conc }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

async function cleanup(prefix: string): Promise<void> {
  const c = new IORedis(REDIS_URL);
  let cursor = "0";
  do {
    const [nx, keys] = await c.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 2000);
    cursor = nx;
    if (keys.length) await c.unlink(...keys);
  } while (cursor !== "0");
  await c.quit();
}

/** Stored value bytes (field names + values) under `prefix` for `keys`, and Redis MEMORY USAGE of a sample. */
async function storedBytes(prefix: string, keys: string[]): Promise<{ value: number; memory: number }> {
  const c = new IORedis(REDIS_URL);
  const sample = keys.slice(0, 200);
  let value = 0;
  let memory = 0;
  for (const k of sample) {
    const h = await c.hgetallBuffer(`${prefix}traj:${k}`);
    for (const [f, v] of Object.entries(h)) value += f.length + v.length;
    memory += Number(await c.call("MEMORY", "USAGE", `${prefix}traj:${k}`, "SAMPLES", "0"));
  }
  await c.quit();
  return { value: value / sample.length, memory: memory / sample.length };
}

const records = makeRecords(N, T);
const tokens = N * T;
console.log(`queue bench: ${N} trajectories × ${T} tokens, concurrency ${CONC}, redis ${REDIS_URL}`);

// 1. Encoding of token arrays: base64 little-endian bytes (chosen) vs JSON arrays.
{
  const sample = records.slice(0, 200).map((r) => validateRecord(r));
  const rows = [["encoding", "bytes/token", "encode µs/traj", "decode µs/traj"]];
  const enc = { b64: [] as number[], json: [] as number[] };
  const dec = { b64: [] as number[], json: [] as number[] };
  let b64Bytes = 0;
  let jsonBytes = 0;
  for (let rep = 0; rep < 5; rep++) {
    let t = performance.now();
    const e1 = sample.map(encodeRecord);
    enc.b64.push(((performance.now() - t) * 1000) / sample.length);
    t = performance.now();
    for (const e of e1) decodeRecord({ ...e });
    dec.b64.push(((performance.now() - t) * 1000) / sample.length);
    t = performance.now();
    const e2 = sample.map((r) => ({
      meta: JSON.stringify({ ...r, prompt_ids: undefined, response_ids: undefined, response_mask: undefined, rollout_log_probs: undefined }),
      prompt_ids: JSON.stringify(r.prompt_ids),
      response_ids: JSON.stringify(r.response_ids),
      response_mask: JSON.stringify(r.response_mask),
      rollout_log_probs: JSON.stringify(r.rollout_log_probs),
    }));
    enc.json.push(((performance.now() - t) * 1000) / sample.length);
    t = performance.now();
    for (const e of e2) {
      JSON.parse(e.meta);
      JSON.parse(e.prompt_ids);
      JSON.parse(e.response_ids);
      JSON.parse(e.response_mask);
      JSON.parse(e.rollout_log_probs);
    }
    dec.json.push(((performance.now() - t) * 1000) / sample.length);
    const size = (o: Record<string, string | undefined>) => Object.values(o).reduce((s, v) => s + (v?.length ?? 0), 0);
    b64Bytes = e1.reduce((s, e) => s + size({ ...e }), 0) / sample.length;
    jsonBytes = e2.reduce((s, e) => s + size(e), 0) / sample.length;
  }
  const raw = (T / 2) * 4 + (T / 2) * (4 + 1 + 4);
  rows.push(["raw LE bytes (reference, not JSON-safe)", (raw / T).toFixed(2), "-", "-"]);
  rows.push(["base64 LE Int32/Uint8/Float32 (chosen)", (b64Bytes / T).toFixed(2), median(enc.b64).toFixed(0), median(dec.b64).toFixed(0)]);
  rows.push(["JSON arrays", (jsonBytes / T).toFixed(2), median(enc.json).toFixed(0), median(dec.json).toFixed(0)]);
  printTable("token-array encoding (per 2,048-token trajectory incl. meta JSON)", rows);
}

// 2. TCP client: Bun RedisClient vs ioredis, raw SET and queue put.
{
  const n = Math.min(N, 3000);
  const sample = records.slice(0, n);
  const payload = sample.map((r) => JSON.stringify(encodeRecord(validateRecord(r))));
  const rows = [["client", "raw SET/s (concurrent)", "queue put/s", "serial GET µs"]];
  for (const name of ["bun RedisClient", "ioredis"] as const) {
    const setRates: number[] = [];
    const putRates: number[] = [];
    const gets: number[] = [];
    for (let rep = 0; rep < 2; rep++) {
      const prefix = `${RUN}client:${rep}:`;
      const cmd: RedisCommander = name === "ioredis" ? new (await import("../infra/redis/ioredis-commander.ts")).IoRedisCommander(REDIS_URL) : new BunRedisCommander(REDIS_URL);
      let dt = await timed(() => parallel(payload.map((p, i) => [i, p] as const), CONC, ([i, p]) => cmd.exec(["SET", `${prefix}s:${i}`, p])));
      setRates.push(n / dt);
      let t = performance.now();
      for (let i = 0; i < 500; i++) await cmd.exec(["GET", `${prefix}s:${i}`]);
      gets.push(((performance.now() - t) * 1000) / 500);
      const q = new RedisTransferQueue(cmd, { prefix });
      dt = await timed(() => parallel(sample, CONC, (r) => q.put(r)));
      putRates.push(n / dt);
      await q.close();
      await cleanup(prefix);
    }
    rows.push([name, median(setRates).toFixed(0), median(putRates).toFixed(0), median(gets).toFixed(1)]);
  }
  printTable(`TCP client (${n} trajectories, median of 2 runs)`, rows);
}

// 3. Adapters side by side with the raw pipelined baseline.
{
  const bridgeToken = crypto.randomUUID();
  const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: bridgeToken });
  const rows = [["adapter", "put/s", "tokens/s (M)", "payload MB/s", "stored B/token", "redis mem B/token", "vs raw baseline"]];
  const keys = records.map((r) => r.key);
  const payloadBytes = records.slice(0, 200).reduce((s, r) => s + encodedFields(encodeRecord(validateRecord(r))).reduce((a, v) => a + v.length, 0), 0) / 200;

  // Raw baseline: the same encoded hash fields, written as one SET per trajectory through ioredis pipelines of 64.
  const basePrefix = `${RUN}raw:`;
  const blobs = records.map((r) => encodedFields(encodeRecord(validateRecord(r))).join("\n"));
  const io = new IORedis(REDIS_URL);
  const baseDt = await timed(async () => {
    for (let i = 0; i < blobs.length; i += CONC) {
      const p = io.pipeline();
      for (let j = i; j < Math.min(i + CONC, blobs.length); j++) p.set(`${basePrefix}${keys[j]}`, blobs[j]!);
      await p.exec();
    }
  });
  const baseMem = Number(await io.call("MEMORY", "USAGE", `${basePrefix}${keys[0]}`, "SAMPLES", "0"));
  await io.quit();
  await cleanup(basePrefix);
  const baseRate = N / baseDt;

  const adapters: [string, string, () => TransferQueue][] = [
    ["memory", "", () => new MemoryTransferQueue()],
    ["redis tcp (ioredis)", `${RUN}tcp:`, () => createRedisTransferQueue({ url: REDIS_URL, prefix: `${RUN}tcp:` })],
    ["upstash rest (bridge)", `${RUN}up:`, () => createUpstashTransferQueue({ url: bridge.url, token: bridgeToken, prefix: `${RUN}up:`, retries: 0 })],
  ];
  const warm = new MemoryTransferQueue();
  for (const r of records.slice(0, 1000)) await warm.put(r);
  await warm.close();
  for (const [name, prefix, make] of adapters) {
    const q = make();
    const dt = await timed(() => parallel(records, CONC, (r) => q.put(r)));
    const rate = N / dt;
    const stored = prefix ? await storedBytes(prefix, keys) : { value: payloadBytes, memory: NaN };
    rows.push([
      name,
      rate.toFixed(0),
      ((rate * T) / 1e6).toFixed(2),
      ((rate * payloadBytes) / 1e6).toFixed(0),
      (stored.value / T).toFixed(2),
      Number.isNaN(stored.memory) ? "-" : (stored.memory / T).toFixed(2),
      `${(rate / baseRate).toFixed(2)}×`,
    ]);
    await q.close();
    if (prefix) await cleanup(prefix);
  }
  rows.push(["raw pipelined SET (baseline)", baseRate.toFixed(0), ((baseRate * T) / 1e6).toFixed(2), ((baseRate * payloadBytes) / 1e6).toFixed(0), (payloadBytes / T).toFixed(2), (baseMem / T).toFixed(2), "1.00×"]);
  printTable(`put throughput, ${N} × ${T}-token trajectories (${(tokens / 1e6).toFixed(1)} M tokens), concurrency ${CONC}`, rows);
  await bridge.stop();
}
await cleanup(RUN);
