import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import IORedis, { Cluster } from "ioredis";
import { freePort } from "./redis-server.ts";

/** A private local Redis Cluster of `masters` masters (and `replicas` replicas each) on loopback; never the shared server. */
export interface PrivateCluster {
  /** Every node's port: masters first (as created), then replicas. */
  ports: number[];
  /** `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…` */
  url: string;
  /** An ioredis Cluster client for assertions; close it with `quit()`. */
  client(): Cluster;
  /** A plain connection to one node (for CLUSTER KEYSLOT and the like). */
  node(i?: number): IORedis;
  /** SIGKILLs the node on `port` (a master: its replica is promoted after the node timeout). */
  kill(port: number): Promise<void>;
  /** Starts a killed node again with its nodes.conf (no data): it rejoins, as a replica of whoever took its slots. */
  restart(port: number): void;
  /** The current masters' ports and, for each, its slot ranges' first slot (CLUSTER NODES of a live node). */
  masters(): Promise<{ port: number; firstSlot: number }[]>;
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
export async function privateCluster(masters = 3, opts: { replicas?: number; nodeTimeoutMs?: number } = {}): Promise<PrivateCluster> {
  const replicas = opts.replicas ?? 0;
  const nodes = masters * (1 + replicas);
  const ports: number[] = [];
  while (ports.length < nodes) {
    const p = await freePort();
    if (!ports.includes(p) && p < 55536) ports.push(p);
  }
  const dirs = ports.map(() => mkdtempSync(join(tmpdir(), "edgeloop-cluster-")));
  const start = (i: number) =>
    Bun.spawn(
      ["redis-server", "--port", String(ports[i]), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file", join(dirs[i]!, "nodes.conf"), "--dir", dirs[i]!, "--save", "", "--appendonly", "no", "--daemonize", "no", "--repl-diskless-sync-delay", "0", ...(opts.nodeTimeoutMs ? ["--cluster-node-timeout", String(opts.nodeTimeoutMs)] : [])],
      { stdout: "ignore", stderr: "ignore" },
    );
  const procs = ports.map((_, i) => start(i));
  const conns = ports.map((port) => {
    const c = new IORedis(port, "127.0.0.1", { maxRetriesPerRequest: null, retryStrategy: () => 20 });
    c.on("error", () => {});
    return c;
  });
  const dead = new Set<number>();
  const dispose = async () => {
    for (const c of conns) c.disconnect();
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  };
  try {
    await until("nodes answer PING", 10_000, async () => (await Promise.all(conns.map((c) => c.ping()))).every((r) => r === "PONG"));
    const create = Bun.spawn(["redis-cli", "--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", String(replicas), "--cluster-yes"], { stdout: "pipe", stderr: "pipe" });
    const code = await create.exited;
    if (code !== 0) throw new Error(`redis-cli --cluster create exited ${code}: ${await new Response(create.stdout).text()}`);
    await until("cluster_state:ok on every node", 20_000, async () => {
      const infos = await Promise.all(conns.map((c) => c.cluster("INFO") as Promise<string>));
      return infos.every((s) => s.includes("cluster_state:ok") && s.includes(`cluster_known_nodes:${nodes}`) && s.includes("cluster_slots_ok:16384"));
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
    async kill(port) {
      const i = ports.indexOf(port);
      dead.add(port);
      procs[i]!.kill("SIGKILL");
      await procs[i]!.exited;
    },
    restart(port) {
      const i = ports.indexOf(port);
      dead.delete(port);
      procs[i] = start(i);
    },
    async masters() {
      const live = conns.find((_, i) => !dead.has(ports[i]!))!;
      const text = (await live.cluster("NODES")) as string;
      return text
        .trim()
        .split("\n")
        .map((l) => l.split(" "))
        .filter((f) => f[2]!.includes("master") && !f[2]!.includes("fail") && f.length > 8)
        .map((f) => ({ port: Number(/:(\d+)@/.exec(f[1]!)![1]), firstSlot: Number(f[8]!.split("-")[0]) }));
    },
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
