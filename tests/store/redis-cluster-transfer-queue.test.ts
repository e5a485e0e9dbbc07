import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Cluster } from "ioredis";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { shardTags } from "../../shared/store/key-slot.ts";
import { clusterKeys, privateCluster, type PrivateCluster } from "../helpers/redis-cluster.ts";
import { transferQueueContract, makeRecord } from "./contract.ts";

const SHARDS = 3;
const cluster: PrivateCluster = await privateCluster(3);
const raw: Cluster = cluster.client();
/** A tagged name without its `{tag}:` (so the contract's byte checks read as on one server). */
const untag = (k: string) => k.replace(/\{[^}]*\}:/, "");

afterAll(async () => {
  await raw.quit();
  await cluster.dispose();
});

describe("redis cluster (ioredis Cluster, 3 masters, 3 shards)", () => {
  transferQueueContract(
    "redis cluster",
    {
      open: (opts) => createRedisTransferQueue({ url: cluster.url, shards: SHARDS, ...opts }),
      sharesState: true,
      rawRecord: async (prefix, key) => {
        const q = createRedisTransferQueue({ url: cluster.url, shards: SHARDS, prefix });
        const name = q.layout.traj(key);
        await q.close();
        return raw.hgetall(name);
      },
      rawKeys: async (prefix) => Object.fromEntries(await Promise.all((await clusterKeys(raw, prefix)).map(async (k) => [prefix + untag(k.slice(prefix.length)), await raw.pttl(k)] as const))),
    },
    "cl:",
  );
});

describe("cluster key layout", () => {
  let node: ReturnType<PrivateCluster["node"]>;
  beforeAll(() => {
    node = cluster.node(0);
  });
  afterAll(async () => {
    await node.quit();
  });

  test("the 3 shard tags land on the 3 masters' slot ranges", async () => {
    const tags = shardTags(3);
    expect(tags).toEqual(["s0.4", "s1.11", "s2.1"]);
    const slots = await Promise.all(tags.map((t) => node.cluster("KEYSLOT", `{${t}}`)));
    expect(slots).toEqual([3890, 9240, 12791]);
  });

  test("a group's hash, key set, records, staging hash and its shard's streams share one slot (CLUSTER KEYSLOT)", async () => {
    const q = createRedisTransferQueue({ url: cluster.url, shards: SHARDS, prefix: "slot:" });
    const uid = "g-slot-1";
    const s = q.layout.shardOf(uid);
    const names = [q.layout.group(uid), q.layout.members(uid), q.layout.traj(`${uid}_0_0`), q.layout.traj(`${uid}_7_3`), q.layout.stage(`${uid}_0_0`, "abc"), q.layout.stream("train", s), q.layout.stream("val", s), q.layout.filtered("train", s)];
    expect(names[0]).toBe(`slot:{${shardTags(3)[s]}}:group:g-slot-1`);
    const slots = await Promise.all(names.map((k) => node.cluster("KEYSLOT", k)));
    expect(new Set(slots).size).toBe(1);
    expect(slots[0]).toBe([3890, 9240, 12791][s]);
    await q.close();
  });

  test("groups of every shard are delivered exactly once across shards", async () => {
    const prefix = "once:";
    const q = createRedisTransferQueue({ url: cluster.url, shards: SHARDS, prefix });
    const uids = Array.from({ length: 30 }, (_, i) => `once-${i}`);
    const shards = new Set(uids.map((u) => q.layout.shardOf(u)));
    expect(shards.size).toBe(3);
    for (const uid of uids) {
      await q.expectGroup(uid, 2);
      await q.put(makeRecord(uid, 0));
      await q.put(makeRecord(uid, 1));
    }
    const a = createRedisTransferQueue({ url: cluster.url, shards: SHARDS, prefix });
    const seen: string[] = [];
    const ids: string[] = [];
    for (let i = 0; i < 10 && seen.length < 30; i++) {
      for (const [reader, name] of [[q, "t1"], [a, "t2"]] as const) {
        const got = await reader.readCompleteGroups({ consumer: name, max: 7 });
        for (const g of got) {
          seen.push(g.uid);
          ids.push(g.delivery_id);
          expect(g.records.map((r) => r.key)).toEqual([`${g.uid}_0_0`, `${g.uid}_1_0`]);
        }
      }
    }
    expect(seen.sort()).toEqual([...uids].sort());
    expect(ids.every((d) => /^\d+-\d+@[0-2]$/.test(d))).toBe(true);
    expect(await q.ack(ids)).toBe(30);
    expect(await a.readCompleteGroups({ consumer: "t2", max: 50, block_ms: 50 })).toEqual([]);
    await q.close();
    await a.close();
  });
});

describe("python reader on the cluster", () => {
  test("redis-py RedisCluster reads every shard's groups exactly once and acks them", async () => {
    const prefix = "py:";
    const q = createRedisTransferQueue({ url: cluster.url, shards: SHARDS, prefix });
    const uids = Array.from({ length: 30 }, (_, i) => `py-${i}`);
    for (const uid of uids) {
      await q.expectGroup(uid, 2);
      await q.put(makeRecord(uid, 0));
      await q.put(makeRecord(uid, 1));
    }
    const script = `
import json, sys
sys.path.insert(0, "clients/python")
from edgeloop.reader import Reader
a = Reader(url=sys.argv[1], prefix="py:", shards=3)
b = Reader(url=sys.argv[1], prefix="py:", shards=3)
seen, acked = [], 0
for _ in range(10):
    for r, c in ((a, "p1"), (b, "p2")):
        gs = r.groups(max=7, consumer=c, block_ms=0)
        seen += [[g.uid, g.delivery_id.split("@")[1], [x["key"] for x in g.records], [int(t) for t in g.records[0]["response_ids"]]] for g in gs]
        acked += r.ack(gs)
print(json.dumps({"seen": seen, "acked": acked, "again": len(a.groups(max=50, consumer="p1", block_ms=30))}))
`;
    const p = Bun.spawn(["/usr/bin/python3", "-c", script, cluster.url], { stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = [await new Response(p.stdout).text(), await new Response(p.stderr).text(), await p.exited];
    expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
    const r = JSON.parse(out) as { seen: [string, string, string[], number[]][]; acked: number; again: number };
    expect(r.seen.map((s) => s[0]).sort()).toEqual([...uids].sort());
    expect(r.seen.every(([uid, shard, keys, ids]) => Number(shard) === q.layout.shardOf(uid) && JSON.stringify(keys) === JSON.stringify([`${uid}_0_0`, `${uid}_1_0`]) && JSON.stringify(ids) === "[9707,11,151645]")).toBe(true);
    expect([r.acked, r.again]).toEqual([30, 0]);
    await q.close();
  }, 30_000);
});
