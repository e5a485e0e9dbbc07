/**
 * Blob-store benchmark (issue 31 item 2): transfer-queue `put` throughput over Redis TCP for records
 * without routed experts, with them inline (packed, in the record hash) and with them packed into a
 * blob store (filesystem, fsynced; S3 protocol through s3rver on loopback) behind `BlobOffloadQueue`;
 * the bytes each record leaves in Redis (`MEMORY USAGE` of its hash and the sum of its field values);
 * and reads back (`get`, the blob fetched and its SHA-256 checked). Default shape: 2,048-token
 * trajectories × [48 layers, top-8] of 128 experts (Qwen3-30B-A3B; packs to uint8, 786 KB a record).
 * Cleans its keys, files and server up.
 *
 *   bun bench/blobs.ts [--reps 5] [--n 32] [--tokens 2048] [--layers 48] [--top-k 8] [--experts 128] [--concurrency 8] [--threshold 65536]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import IORedis from "ioredis";
import S3rver from "s3rver";
import { FsBlobStore } from "../infra/blobs/fs-blob-store.ts";
import { S3BlobStore } from "../infra/blobs/s3-blob-store.ts";
import { createRedisTransferQueue } from "../infra/redis/redis-transfer-queue.ts";
import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { BlobOffloadQueue } from "../shared/store/blob-offload-queue.ts";
import type { BlobStore } from "../shared/store/blob-store.ts";
import { keyPart } from "../shared/store/key-encoding.ts";
import type { TransferQueue } from "../shared/store/types.ts";
import { arg, median, printTable, syntheticRecord } from "./util.ts";

const N = Number(arg("--n", "32"));
const T = Number(arg("--tokens", "2048"));
const LAYERS = Number(arg("--layers", "48"));
const TOPK = Number(arg("--top-k", "8"));
const EXPERTS = Number(arg("--experts", "128"));
const CONC = Number(arg("--concurrency", "8"));
const THRESHOLD = Number(arg("--threshold", "65536"));
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const RUN = `bench:blobs:${crypto.randomUUID().slice(0, 8)}:`;

function makeRecords(n: number, experts: boolean, tag: string): TrajectoryRecord[] {
  const half = T >> 1;
  let seed = 4242;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const prompt = Array.from({ length: half }, () => Math.floor(rnd() * 151000));
  const out: TrajectoryRecord[] = [];
  for (let i = 0; i < n; i++) {
    const rec = syntheticRecord(`${tag}${Math.floor(i / 8)}`, i % 8, prompt, half, rnd);
    if (experts) {
      const e = new Array<number>(T * LAYERS * TOPK);
      for (let j = 0; j < e.length; j += TOPK) {
        const base = Math.floor(rnd() * EXPERTS);
        for (let k = 0; k < TOPK; k++) e[j + k] = (base + k * 5) % EXPERTS;
      }
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

async function cleanup(redis: IORedis, prefix: string): Promise<void> {
  let cursor = "0";
  do {
    const [nx, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 2000);
    cursor = nx;
    if (keys.length) await redis.unlink(...keys);
  } while (cursor !== "0");
}

console.log(`blobs bench: ${N} trajectories × ${T} tokens, experts [${LAYERS}, ${TOPK}] of ${EXPERTS}, concurrency ${CONC}, threshold ${THRESHOLD} B, redis ${REDIS_URL}`);
const redis = new IORedis(REDIS_URL);
const dir = mkdtempSync(join(tmpdir(), "edgeloop-bench-blobs-"));
const s3dir = mkdtempSync(join(tmpdir(), "edgeloop-bench-s3-"));
const s3 = new S3rver({ port: 0, address: "127.0.0.1", silent: true, directory: s3dir, configureBuckets: [{ name: "bench" }] });
const s3port = ((await s3.run()) as { port: number }).port;
const plain = makeRecords(N, false, "p");
const withExperts = makeRecords(N, true, "e");

type Setup = [name: string, recs: TrajectoryRecord[], open: (prefix: string) => TransferQueue];
const blobbed = (store: () => BlobStore) => (prefix: string) => new BlobOffloadQueue(createRedisTransferQueue({ url: REDIS_URL, prefix }), store(), { prefix, thresholdBytes: THRESHOLD });
const setups: Setup[] = [
  ["without experts", plain, (prefix) => createRedisTransferQueue({ url: REDIS_URL, prefix })],
  ["experts inline (packed, in Redis)", withExperts, (prefix) => createRedisTransferQueue({ url: REDIS_URL, prefix })],
  ["experts → filesystem blobs (fsync)", withExperts, blobbed(() => new FsBlobStore(dir))],
  ["experts → S3 blobs (s3rver, loopback)", withExperts, blobbed(() => new S3BlobStore({ bucket: "bench", prefix: "b", endpoint: `http://127.0.0.1:${s3port}`, credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" } }))],
];

const REPS = Number(arg("--reps", "5"));
const rows = [["record", "puts/s", "× no-experts put", "Redis MEMORY USAGE B/record", "Redis value B/record", "get ms/record"]];
// Setups run interleaved, rep by rep (the machine is shared: a slow minute hits every setup alike), median of REPS.
const rates: number[][] = setups.map(() => []);
const figures: { mem: number; val: number; getMs: number }[] = [];
try {
  for (let rep = 0; rep < REPS; rep++) {
    for (const [si, [name, recs, open]] of setups.entries()) {
      const prefix = `${RUN}${si}:${rep}:`;
      const q = open(prefix);
      const t = performance.now();
      await parallel(recs, CONC, (r) => q.put(r));
      rates[si]!.push(recs.length / ((performance.now() - t) / 1000));
      if (rep === 0) {
        const key = `${prefix}traj:${keyPart(recs[0]!.key)}`;
        const mem = Number(await redis.call("MEMORY", "USAGE", key, "SAMPLES", "0"));
        const h = await redis.hgetall(key);
        const val = Object.entries(h).reduce((n, [k, v]) => n + k.length + Buffer.byteLength(v), 0);
        const t2 = performance.now();
        for (const r of recs.slice(0, 8)) {
          const back = await q.get(r.key);
          const a = back!.routed_experts;
          const b = r.routed_experts;
          if (a?.length !== b?.length || (a && a.some((v, i) => v !== b![i]))) throw new Error(`${name}: ${r.key} did not read back`);
        }
        figures[si] = { mem, val, getMs: (performance.now() - t2) / Math.min(8, recs.length) };
      }
      await q.close();
      await cleanup(redis, prefix);
    }
  }
  const base = median(rates[0]!);
  for (const [si, [name]] of setups.entries()) {
    const rate = median(rates[si]!);
    rows.push([name, rate.toFixed(0), (rate / base).toFixed(2), String(figures[si]!.mem), String(figures[si]!.val), figures[si]!.getMs.toFixed(2)]);
  }
} finally {
  await cleanup(redis, RUN);
  await redis.quit();
  await s3.close();
  rmSync(dir, { recursive: true, force: true });
  rmSync(s3dir, { recursive: true, force: true });
}
printTable(`transfer-queue put over Redis TCP, ${N} × ${T} tokens, experts [${LAYERS}, ${TOPK}] of ${EXPERTS}, concurrency ${CONC}`, rows);
