// Put throughput of the transfer queue on a 3-master loopback Redis Cluster with 1, 2 and 3 stream shards
// (issue 31): `bun bench/cluster.ts [puts]`. Starts and stops its own cluster (tests/helpers/redis-cluster.ts).
import { createRedisTransferQueue } from "../infra/redis/redis-transfer-queue.ts";
import { makeRecord } from "../tests/store/contract.ts";
import { privateCluster } from "../tests/helpers/redis-cluster.ts";

const PUTS = Number(process.argv[2] ?? 4000);
const CONCURRENCY = 64;
const cluster = await privateCluster(3);
try {
  const rows: { shards: number; puts_per_s: number }[] = [];
  for (const shards of [1, 2, 3]) {
    const q = createRedisTransferQueue({ url: cluster.url, shards, prefix: `bench${shards}:` });
    await q.put(makeRecord("warm", 0));
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < PUTS) {
          const i = next++;
          await q.put(makeRecord(`g${i >> 2}`, i & 3));
        }
      }),
    );
    const s = (performance.now() - t0) / 1000;
    rows.push({ shards, puts_per_s: Math.round(PUTS / s) });
    await q.close();
  }
  const base = rows[0]!.puts_per_s;
  for (const r of rows) console.log(`shards=${r.shards}  ${r.puts_per_s} puts/s  ${(r.puts_per_s / base).toFixed(2)}x`);
} finally {
  await cluster.dispose();
}
