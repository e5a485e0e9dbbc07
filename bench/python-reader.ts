/**
 * Python reader benchmark (issue 16, "Measure"): read throughput of the
 * `edgeloop` Python package (clients/python: `Reader.groups`, records decoded
 * into numpy) against reading the same bytes raw with redis-py (the same
 * XREADGROUP + pipelined HGETALL, no decoding), on G groups × 8 records of T
 * tokens (default 256 × 8 × 2,048: 1,024 prompt + 1,024 response tokens with
 * mask and log-probs) written by the TCP queue. Also the decode cost per
 * record, padding a 64-record batch, and decoding routed experts (48 layers ×
 * top-8, in memory). Python is `EDGELOOP_PYTHON`, else /usr/bin/python3, else
 * `python3` (needs redis and numpy). Cleans its keys up.
 *
 *   bun bench/python-reader.ts [--groups 256] [--tokens 2048] [--repeats 3]
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import IORedis from "ioredis";
import { createRedisTransferQueue } from "../infra/redis/redis-transfer-queue.ts";
import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { arg, printTable, syntheticRecord } from "./util.ts";

const G = Number(arg("--groups", "256"));
const T = Number(arg("--tokens", "2048"));
const REPEATS = arg("--repeats", "3");
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const PY = process.env.EDGELOOP_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
const RUN = `bench:pyreader:${crypto.randomUUID().slice(0, 8)}:`;

function record(uid: string, sid: number, tokens: number, rnd: () => number): TrajectoryRecord {
  const half = tokens >> 1;
  const prompt = Array.from({ length: half }, () => Math.floor(rnd() * 151000));
  return syntheticRecord(uid, sid, prompt, half, rnd);
}

async function cleanup(): Promise<void> {
  const c = new IORedis(REDIS_URL);
  let cursor = "0";
  do {
    const [next, keys] = await c.scan(cursor, "MATCH", `${RUN}*`, "COUNT", 1000);
    cursor = next;
    if (keys.length) await c.unlink(...keys);
  } while (cursor !== "0");
  await c.quit();
}

const q = createRedisTransferQueue({ url: REDIS_URL, prefix: RUN });
try {
  let seed = 12345;
  const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
  for (let g = 0; g < G; g++) {
    const uid = `b${g}`;
    await q.expectGroup(uid, 8);
    await Promise.all(Array.from({ length: 8 }, (_, s) => q.put(record(uid, s, T, rnd))));
  }
  const p = Bun.spawnSync([PY, join(import.meta.dir, "python-reader.py"), "--url", REDIS_URL, "--prefix", RUN, "--groups", String(G), "--repeats", REPEATS], { stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`python-reader.py exited ${p.exitCode}: ${p.stderr.toString()}`);
  const r = JSON.parse(p.stdout.toString());
  const mtok = (s: number) => (r.tokens / s / 1e6).toFixed(2);
  console.log(`Python ${r.python}, redis-py ${r.redis_py}, numpy ${r.numpy}; ${r.groups} groups, ${r.records} records, ${r.tokens} tokens (${T} per record), ${(r.stored_bytes / r.tokens).toFixed(2)} stored bytes/token; median of ${REPEATS}`);
  printTable("Python read throughput (one consumer, max=16 groups per read)", [
    ["reader", "seconds", "M tokens/s", "records/s"],
    ["edgeloop.Reader.groups → numpy", r.edgeloop_s.toFixed(3), mtok(r.edgeloop_s), (r.records / r.edgeloop_s).toFixed(0)],
    ["raw redis-py (same commands, bytes only)", r.raw_s.toFixed(3), mtok(r.raw_s), (r.records / r.raw_s).toFixed(0)],
  ]);
  printTable("Python decode and padding", [
    ["step", "µs", "note"],
    ["decode_record (2,048-token record)", (r.decode_s_per_record * 1e6).toFixed(0), "base64 → numpy, all arrays"],
    ["to_padded, 64 records", (r.pad_64_s * 1e6).toFixed(0), `→ input_ids ${r.pad_64_shape.join("×")}`],
    [
      `decode_record with routed experts (${r.experts.layers} layers × top-${r.experts.top_k})`,
      (r.experts.decode_s_per_record * 1e6).toFixed(0),
      `${(r.experts.tokens_per_s / 1e6).toFixed(2)} M tokens/s; +${r.experts.stored_bytes_per_token.toFixed(0)} stored bytes/token`,
    ],
  ]);
} finally {
  await q.close();
  await cleanup();
}
