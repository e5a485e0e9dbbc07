import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startGatewayProcess } from "../helpers/gateway-process.ts";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gatewayOptions } from "../../infra/cli/gateway-options.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { REDIS_URL } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The gateway's health-check period, ε and sticky-key capacity reach `edgeloop gateway` from flags and from
// the config file (issue 18 item 10: nothing built and unreachable), and every gateway built from a config
// (gateway command, embedded gateway, teacher urls) gets them through one mapping.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const procs: ReturnType<typeof Bun.spawn>[] = [];
let dir: string;
let replica: ReturnType<typeof Bun.serve>;
let healthHits = 0;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-gwcfg-"));
  // A replica that counts its health probes and answers /v1/models.
  replica = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/health") {
        healthHits++;
        return new Response("ok");
      }
      return Response.json({ object: "list", data: [{ id: "m", object: "model", max_model_len: 4096 }] });
    },
  });
});
afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGTERM");
    await p.exited;
  }
  replica.stop(true);
  rmSync(dir, { recursive: true, force: true });
});

async function startGateway(args: string[]): Promise<{ url: string; banner: string }> {
  return startGatewayProcess(["--replicas", `http://127.0.0.1:${replica.port}`, ...args, "--port", "0"], procs);
}

/** Health probes the replica saw while `calls` proxied calls went through the gateway, 60 ms apart. */
async function probesDuring(url: string, calls: number): Promise<number> {
  const before = healthHits;
  for (let i = 0; i < calls; i++) {
    const res = await fetch(`${url}/v1/models`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await Bun.sleep(60);
  }
  await Bun.sleep(100);
  return healthHits - before;
}

describe("gateway settings from flags and config", () => {
  test("--health-interval-ms 100 probes the replica while traffic flows; 0 never probes it", async () => {
    const often = await startGateway(["--health-interval-ms", "100"]);
    expect(often.banner).toContain("health checks every 100 ms");
    // 12 calls 60 ms apart span ~720 ms: a probe is due every other call.
    const n = await probesDuring(often.url, 12);
    expect(n).toBeGreaterThanOrEqual(3);

    const never = await startGateway(["--health-interval-ms", "0"]);
    expect(never.banner).toContain("health checks on demand");
    expect(await probesDuring(never.url, 12)).toBe(0);
  }, HANG_MS);

  test("the config file's gateway section sets ε and the sticky-key capacity; a flag overrides the file", async () => {
    const cfg = join(dir, "gw.json");
    writeFileSync(cfg, JSON.stringify({ gateway: { epsilon: 0.5, health_interval_ms: 0 } }));
    const hash = await startGateway(["--config", cfg, "--policy", "bounded_load_hash"]);
    expect(hash.banner).toContain("(bounded_load_hash, ε 0.5;");
    expect(hash.banner).toContain("health checks on demand");
    const keys = join(dir, "keys.json");
    writeFileSync(keys, JSON.stringify({ gateway: { max_sticky_keys: 64 } }));
    expect((await startGateway(["--config", keys])).banner).toContain("(least_inflight_sticky, 64 sticky keys;");
    const sticky = await startGateway(["--config", keys, "--max-sticky-keys", "32"]);
    expect(sticky.banner).toContain("(least_inflight_sticky, 32 sticky keys;");
    const defaults = await startGateway(["--policy", "bounded_load_hash"]);
    expect(defaults.banner).toContain("(bounded_load_hash, ε 0.25;");
    expect(defaults.banner).toContain("health checks every 5000 ms");
  }, HANG_MS);

  test("settings the chosen routing would not use exit 2, naming the flag or the config key", () => {
    const run = (args: string[]) => Bun.spawnSync([process.execPath, MAIN, "gateway", "--replicas", "http://127.0.0.1:1", "--port", "0", ...args], { stdout: "pipe", stderr: "pipe" });
    const cases: [string[], string][] = [
      [["--epsilon", "0.5"], "edgeloop: --epsilon: applies to --policy bounded_load_hash or to routing state shared in the store, not to least_inflight_sticky"],
      [["--epsilon", "0.5", "--policy", "round_robin"], "edgeloop: --epsilon: applies to --policy bounded_load_hash or to routing state shared in the store, not to round_robin"],
      [["--max-sticky-keys", "5", "--policy", "bounded_load_hash"], "edgeloop: --max-sticky-keys: applies to --policy least_inflight_sticky, not to bounded_load_hash"],
      [["--store", REDIS_URL, "--policy", "round_robin"], "edgeloop: --policy: is not used with routing state shared in the store (sticky pins under a bounded-load cap); add --no-shared-state to route with --policy round_robin, or drop --policy"],
      [["--store", REDIS_URL, "--max-sticky-keys", "5"], "edgeloop: --max-sticky-keys: applies to a per-process least_inflight_sticky gateway; with routing state shared in the store, pins expire after gateway.pin_ttl_ms instead"],
    ];
    for (const [args, line] of cases) {
      const r = run(args);
      expect({ args, code: r.exitCode, stderr: r.stderr.toString() }).toEqual({ args, code: 2, stderr: `${line}\n` });
    }
    const cfg = join(dir, "sticky-eps.json");
    writeFileSync(cfg, JSON.stringify({ gateway: { sticky_epsilon: 2 } }));
    const r = run(["--config", cfg]);
    expect([r.exitCode, r.stderr.toString()]).toEqual([2, `edgeloop: config gateway.sticky_epsilon: applies only with routing state shared in the store (a Redis/Upstash store and gateway.shared_state) (in ${cfg})\n`]);
  }, HANG_MS);

  test("bad values exit 2 naming the flag or the config key", async () => {
    const run = (args: string[]) => Bun.spawnSync([process.execPath, MAIN, "gateway", "--replicas", "http://127.0.0.1:1", "--port", "0", ...args], { stdout: "pipe", stderr: "pipe" });
    let r = run(["--epsilon", "0"]);
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toBe("edgeloop: --epsilon must be a number > 0, got '0' (see edgeloop gateway --help)\n");
    r = run(["--health-interval-ms", "-1"]);
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toBe("edgeloop: --health-interval-ms must be an integer >= 0, got '-1' (see edgeloop gateway --help)\n");
    const cfg = join(dir, "bad.json");
    writeFileSync(cfg, JSON.stringify({ gateway: { max_sticky_keys: 0 } }));
    r = run(["--config", cfg]);
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toContain("gateway.max_sticky_keys");
  }, HANG_MS);

  test("gatewayOptions maps every key; null ε keeps the gateway's own defaults", () => {
    const d = parseAppConfig({}, "test").gateway;
    expect(gatewayOptions(d)).toEqual({ ejectAfter: 3, cooldownMs: 10_000, maxAttempts: 3, healthIntervalMs: 5_000, maxStickyKeys: 10_000 });
    const set = parseAppConfig({ gateway: { attempt_timeout_ms: 900, epsilon: 0.3, sticky_epsilon: 2, max_sticky_keys: 7, health_interval_ms: 0 } }, "test").gateway;
    expect(gatewayOptions(set)).toEqual({ attemptTimeoutMs: 900, ejectAfter: 3, cooldownMs: 10_000, maxAttempts: 3, healthIntervalMs: 0, epsilon: 0.3, stickyEpsilon: 2, maxStickyKeys: 7 });
  });
});
