import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import IORedis, { Cluster } from "ioredis";
import { freePort } from "./redis-server.ts";

/** A private local Redis Cluster of `masters` masters (no replicas) on loopback; never the shared server. */
export interface PrivateCluster {
  ports: number[];
  /** `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…` */
  url: string;
  /** An ioredis Cluster client for assertions; close it with `quit()`. */
  client(): Cluster;
  /** A plain connection to one node (for CLUSTER KEYSLOT and the like). */
  node(i?: number): IORedis;
  /** Kills every node and removes their directories. */
  dispose(): Promise<void>;
}

/** Answers once `fn` is true, polling it (each poll is a real round trip), or throws after `ms`. */
async function until(what: string, ms: number, fn: () => Promise<boolean>): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn().catch(() => false)) return;
    if (Date.now() > end) throw new Error(`redis cluster: ${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Starts `masters` `redis-server --cluster-enabled yes` nodes (`--save ""
 * --appendonly no`, each in a temp dir) on free ports, joins them with
 * `redis-cli --cluster create … --cluster-replicas 0 --cluster-yes` (equal
 * contiguous slot ranges, the first node holding 0…), and resolves once every
 * node reports `cluster_state:ok` and knows all masters.
 */
export async function privateCluster(masters = 3): Promise<PrivateCluster> {
  const ports: number[] = [];
  while (ports.length < masters) {
    const p = await freePort();
    if (!ports.includes(p) && p < 55536) ports.push(p);
  }
  const dirs = ports.map(() => mkdtempSync(join(tmpdir(), "edgeloop-cluster-")));
  const procs = ports.map((port, i) =>
    Bun.spawn(
      ["redis-server", "--port", String(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file", join(dirs[i]!, "nodes.conf"), "--dir", dirs[i]!, "--save", "", "--appendonly", "no", "--daemonize", "no"],
      { stdout: "ignore", stderr: "ignore" },
    ),
  );
  const conns = ports.map((port) => {
    const c = new IORedis(port, "127.0.0.1", { maxRetriesPerRequest: null, retryStrategy: () => 20 });
    c.on("error", () => {});
    return c;
  });
  const dispose = async () => {
    for (const c of conns) c.disconnect();
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  };
  try {
    await until("nodes answer PING", 10_000, async () => (await Promise.all(conns.map((c) => c.ping()))).every((r) => r === "PONG"));
    const create = Bun.spawn(["redis-cli", "--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", "0", "--cluster-yes"], { stdout: "pipe", stderr: "pipe" });
    const code = await create.exited;
    if (code !== 0) throw new Error(`redis-cli --cluster create exited ${code}: ${await new Response(create.stdout).text()}`);
    await until("cluster_state:ok on every node", 20_000, async () => {
      const infos = await Promise.all(conns.map((c) => c.cluster("INFO") as Promise<string>));
      return infos.every((s) => s.includes("cluster_state:ok") && s.includes(`cluster_known_nodes:${masters}`) && s.includes("cluster_slots_ok:16384"));
    });
  } catch (e) {
    await dispose();
    throw e;
  }
  const url = `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(",")}`;
  return {
    ports,
    url,
    client: () => new Cluster(ports.map((port) => ({ host: "127.0.0.1", port })), { redisOptions: { maxRetriesPerRequest: 1 } }),
    node: (i = 0) => new IORedis(ports[i]!, "127.0.0.1", { maxRetriesPerRequest: 1 }),
    dispose,
  };
}

/** Every key of the cluster under `prefix` (SCAN on each master). */
export async function clusterKeys(c: Cluster, prefix: string): Promise<string[]> {
  const out: string[] = [];
  for (const node of c.nodes("master")) {
    let cursor = "0";
    do {
      const [next, keys] = await node.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
      cursor = next;
      out.push(...keys);
    } while (cursor !== "0");
  }
  return out.sort();
}
