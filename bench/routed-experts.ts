/**
 * Routed-experts benchmark (issues 16, 31): bytes stored per token and transfer-
 * queue `put` throughput for records without `routed_experts`, with them
 * packed (128 experts → uint8, `routed_experts_dtype`) and with them as int32
 * (the layout before packing: the same ids but one of 65,535, which keeps the
 * record int32) (default 48 MoE layers × top-8 of 128 experts,
 * Qwen3-30B-A3B's shape), N trajectories of
 * T tokens (1/2 prompt, 1/2 response with mask and log-probs), on the memory
 * store, Redis over TCP and Upstash REST through the local bridge. Also the
 * record codec's cost per trajectory (validate + encode, decode). Cleans its
 * keys up.
 *
 *   bun bench/routed-experts.ts [--n 64] [--tokens 2048] [--layers 48] [--top-k 8] [--concurrency 8]
 */
import IORedis from "ioredis";
import { createRedisTransferQueue } from "../infra/redis/redis-transfer-queue.ts";
import { startUpstashBridge } from "../infra/upstash-bridge/upstash-bridge.ts";
import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { MemoryTransferQueue } from "../shared/store/memory-transfer-queue.ts";
import { decodeRecord, encodedFields, validateAndEncode } from "../shared/store/record-codec.ts";
import type { TransferQueue } from "../shared/store/types.ts";
import { createUpstashTransferQueue } from "../shared/store/upstash-transfer-queue.ts";
import { arg, median, printTable, syntheticRecord } from "./util.ts";

const N = Number(arg("--n", "64"));
const T = Number(arg("--tokens", "2048"));
const LAYERS = Number(arg("--layers", "48"));
const TOPK = Number(arg("--top-k", "8"));
const CONC = Number(arg("--concurrency", "8"));
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const RUN = `bench:experts:${crypto.randomUUID().slice(0, 8)}:`;

function makeRecords(n: number, tokens: number, experts: false | "packed" | "int32", tag: string): TrajectoryRecord[] {
  const half = tokens >> 1;
  let seed = 4242;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const prompt = Array.from({ length: half }, () => Math.floor(rnd() * 151000));
  const out: TrajectoryRecord[] = [];
  for (let i = 0; i < n; i++) {
    const uid = `${tag}${Math.floor(i / 8)}`;
    const rec = syntheticRecord(uid, i % 8, prompt, half, rnd);
    if (experts) {
      // Expert ids as a MoE router picks them: top-k distinct ids of 128 per layer.
      const e = new Array<number>(tokens * LAYERS * TOPK);
      for (let j = 0; j < e.length; j += TOPK) {
        const base = Math.floor(rnd() * 128);
        for (let k = 0; k < TOPK; k++) e[j + k] = (base + k * 5) % 128;
      }
      // An id above 65,534 is stored int32: the bytes records had before packing.
      if (experts === "int32") e[e.length - 1] = 65535;
      rec.routed_experts = e;
      rec.routed_experts_shape = [LAYERS, TOPK];
    }
    out.push(rec);
  }
  return out;
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

console.log(`routed-experts bench: ${N} trajectories × ${T} tokens, experts [${LAYERS}, ${TOPK}], concurrency ${CONC}, redis ${REDIS_URL}`);
const plain = makeRecords(N, T, false, "p");
const withExperts = makeRecords(N, T, "packed", "e");
const withInt32 = makeRecords(N, T, "int32", "i");

// 1. Stored bytes per token (hash field names + values, as HSET writes them) and codec cost.
{
  const rows = [["record", "stored bytes/token", "of which routed_experts", "validate+encode ms/traj", "decode ms/traj"]];
  for (const [name, recs] of [["without experts", plain], [`experts [${LAYERS}, ${TOPK}] int32`, withInt32], [`experts [${LAYERS}, ${TOPK}] packed (uint8)`, withExperts]] as const) {
    const sample = recs.slice(0, Math.min(16, recs.length));
    const enc: number[] = [];
    const dec: number[] = [];
    let bytes = 0;
    let expertBytes = 0;
    for (let rep = 0; rep < 3; rep++) {
      let t = performance.now();
      const encoded = sample.map((r) => validateAndEncode(r).encoded);
      enc.push((performance.now() - t) / sample.length);
      t = performance.now();
      for (const e of encoded) decodeRecord({ ...e });
      dec.push((performance.now() - t) / sample.length);
      if (rep === 0) {
        for (const e of encoded) {
          const f = encodedFields(e);
          for (let i = 0; i < f.length; i += 2) {
            const b = f[i]!.length + Buffer.byteLength(f[i + 1]!);
            bytes += b;
            if (f[i]!.startsWith("routed_experts")) expertBytes += b;
          }
        }
      }
    }
    rows.push([name, (bytes / sample.length / T).toFixed(1), (expertBytes / sample.length / T).toFixed(1), median(enc).toFixed(2), median(dec).toFixed(2)]);
  }
  printTable("stored bytes per token (experts as base64: int32, or packed to uint8 for 128 experts)", rows);
}

// 2. put throughput per adapter, with and without experts.
{
  const rows = [["adapter", "record", "puts/s", "tokens/s", "MB/s stored"]];
  const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: "bench" });
  const adapters: [string, (prefix: string) => TransferQueue][] = [
    ["memory", () => new MemoryTransferQueue()],
    ["redis tcp", (prefix) => createRedisTransferQueue({ url: REDIS_URL, prefix })],
    ["upstash (bridge)", (prefix) => createUpstashTransferQueue({ url: bridge.url, token: "bench", prefix })],
  ];
  try {
    for (const [name, open] of adapters) {
      for (const [kind, recs] of [["without experts", plain], ["experts int32", withInt32], ["experts packed", withExperts]] as const) {
        const prefix = `${RUN}${name.replace(/\W/g, "")}:${kind.replace(/\W/g, "")}:`;
        const q = open(prefix);
        const bytes = recs.slice(0, 1).map((r) => encodedFields(validateAndEncode(r).encoded).reduce((n, s) => n + Buffer.byteLength(s), 0))[0]!;
        const t = performance.now();
        await parallel(recs, CONC, (r) => q.put(r));
        const s = (performance.now() - t) / 1000;
        await q.close();
        await cleanup(prefix);
        rows.push([name, kind, (recs.length / s).toFixed(0), ((recs.length * T) / s / 1e6).toFixed(2) + " M", ((recs.length * bytes) / s / 1e6).toFixed(1)]);
      }
    }
  } finally {
    await bridge.stop();
    await cleanup(RUN);
  }
  printTable(`transfer-queue put, ${N} × ${T} tokens, concurrency ${CONC}`, rows);
}
