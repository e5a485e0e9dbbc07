import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import IORedis from "ioredis";

/** A free loopback TCP port (bound once, then released). */
export { freePort } from "../../infra/cli/free-port.ts";
import { freePort } from "../../infra/cli/free-port.ts";

/** A private `redis-server` a test may flush, shut down and restart (never the shared one). */
export interface PrivateRedis {
  port: number;
  url: string;
  /** Starts (or restarts) the server on the same port; resolves once it answers PING. */
  start(): Promise<void>;
  /** SIGKILLs the server (no save): an outage; with `persist`, the append-only file keeps what was acknowledged. */
  stop(): Promise<void>;
  /** A plain connection for assertions and FLUSHALL; close it with `quit()`. */
  client(): IORedis;
  /** Sends `sig` to the server process (SIGSTOP / SIGCONT: a replica that stops acknowledging). */
  signal(sig: "SIGSTOP" | "SIGCONT"): void;
  /** Stops the server and removes its directory. */
  dispose(): Promise<void>;
}

/**
 * Spawns `redis-server --port <free> --save ""` with `--appendonly no`
 * (a restart loses everything, as Redis without persistence does) or, with
 * `persist`, `--appendonly yes --appendfsync always` in a temp dir (a restart
 * keeps every acknowledged write: a pure outage). `args` are appended
 * (e.g. `--replicaof 127.0.0.1 <port>` for a replica).
 */
export async function privateRedis(opts: { persist?: boolean; args?: string[] } = {}): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-redis-"));
  const url = `redis://127.0.0.1:${port}`;
  let proc: ReturnType<typeof Bun.spawn> | null = null;
  const args = ["redis-server", "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--dir", dir, "--daemonize", "no"];
  args.push(...(opts.persist ? ["--appendonly", "yes", "--appendfsync", "always"] : ["--appendonly", "no"]), ...(opts.args ?? []));
  const ping = async (): Promise<boolean> => {
    const c = new IORedis(url, { lazyConnect: true, connectTimeout: 300, maxRetriesPerRequest: 0, retryStrategy: () => null });
    c.on("error", () => {});
    try {
      await c.connect();
      return (await c.ping()) === "PONG";
    } catch {
      return false;
    } finally {
      c.disconnect();
    }
  };
  const self: PrivateRedis = {
    port,
    url,
    async start() {
      if (proc && proc.exitCode === null) return;
      proc = Bun.spawn(args, { stdout: "ignore", stderr: "ignore" });
      for (let i = 0; i < 100; i++) {
        if (await ping()) return;
        await Bun.sleep(50);
      }
      throw new Error(`redis-server on port ${port} did not start`);
    },
    async stop() {
      const p = proc;
      proc = null;
      if (!p) return;
      p.kill("SIGKILL");
      await p.exited;
    },
    client: () => new IORedis(url, { maxRetriesPerRequest: 1 }),
    signal(sig) {
      proc?.kill(sig);
    },
    async dispose() {
      await self.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await self.start();
  return self;
}
