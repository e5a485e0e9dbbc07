import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startGatewayProcess } from "../helpers/gateway-process.ts";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TrajectoryRecord } from "../../shared/schema/index.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E8 (edge-cases.md) as a user runs it: `edgeloop gateway --replicas A,B,C`
// where A accepts TCP connections and never answers (a raw socket server),
// then `edgeloop rollout` through the gateway with `engine.timeout_ms: 3000`
// (E8's value: generous, so the healthy replicas never hit it). The gateway has
// no attempt timeout of its own (its default, as on main): the clients'
// aborts at their declared deadline are what count against A.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const procs: ReturnType<typeof Bun.spawn>[] = [];
let dir: string;
let sim: RunningSimEngine;
let silent: import("bun").TCPSocketListener<undefined>;
let accepted = 0;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-e8-"));
  sim = await startSimEngine({ replicas: 2, script: JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8")) });
  // A: accepts connections, reads whatever comes, never writes a byte.
  silent = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open: () => void accepted++,
      data: () => {},
    },
  });
});
afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGTERM");
    await p.exited;
  }
  silent.stop(true);
  await sim.stop();
  rmSync(dir, { recursive: true, force: true });
});

async function startGateway(args: string[]): Promise<{ url: string; banner: string }> {
  return startGatewayProcess([...args, "--port", "0"], procs, { EDGELOOP_ADMIN_TOKEN: "test-admin-token" });
}

describe("E8: one of three replicas hangs", () => {
  test("edgeloop rollout of 24 trajectories through edgeloop gateway: none fails, A is ejected, its sessions re-pinned and counted", async () => {
    const a = `http://127.0.0.1:${silent.port}`;
    const cfgPath = join(dir, "gateway.yaml");
    writeFileSync(cfgPath, "gateway:\n  eject_after: 3\n  cooldown_ms: 5000\n");
    const { url, banner } = await startGateway(["--replicas", [a, ...sim.urls].join(","), "--policy", "bounded_load_hash", "--config", cfgPath, "--cooldown-ms", "60000"]);
    expect(banner).toContain("(bounded_load_hash, ε 0.25; attempt timeout none, eject after 3, cool-down 60000 ms, health checks every 5000 ms)");

    const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 24);
    writeFileSync(join(dir, "rows.jsonl"), rows.join("\n") + "\n");
    writeFileSync(join(dir, "rollout.json"), JSON.stringify({ engine: { url, timeout_ms: 3000 }, rollout: { max_model_len: 8192 } }));
    const p = Bun.spawn([process.execPath, MAIN, "rollout", "--data", "rows.jsonl", "--n", "1", "--config", "rollout.json", "--out", "out.jsonl", "--no-progress"], {
      cwd: dir,
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, NO_COLOR: "1" },
    });
    const [code, stderr] = await Promise.all([p.exited, new Response(p.stderr).text()]);
    expect(stderr).toContain("wrote 24 records to out.jsonl");
    expect(code).toBe(0);
    const records = readFileSync(join(dir, "out.jsonl"), "utf8").trim().split("\n").map((l) => TrajectoryRecord.parse(JSON.parse(l)));
    expect(records.length).toBe(24);
    expect(records.filter((r) => r.error !== null).map((r) => r.error)).toEqual([]);
    expect(records.every((r) => r.finish_reason === "stop")).toBe(true);
    // Every trajectory's turns were answered by B or C (A never answers anything).
    const answered = new Map<string, number>();
    for (const r of sim.replicas) for (const l of r.engine.requests) if (l.finish_reason) answered.set(l.routing_key!, (answered.get(l.routing_key!) ?? 0) + 1);
    for (const r of records) expect(answered.get(r.key) ?? 0).toBeGreaterThanOrEqual(1);

    const admin = await (await fetch(`${url}/admin/replicas`, { headers: { authorization: "Bearer test-admin-token" } })).json();
    expect(admin.breaker).toEqual({ eject_after: 3, cooldown_ms: 60_000, attempt_timeout_ms: null });
    const statusA = admin.replicas.find((r: { url: string }) => r.url === a);
    expect(statusA).toMatchObject({ healthy: false, state: "ejected", ejections: 1, inflight: 0 });
    expect(statusA.failures_by_kind.client_abort).toBe(statusA.failures);
    expect(statusA.failures).toBeGreaterThanOrEqual(3);
    expect(accepted).toBeGreaterThanOrEqual(statusA.failures);
    // Sessions that were on A moved (re-pinned once each, counted on A).
    expect(statusA.repins).toBeGreaterThanOrEqual(1);
    expect(statusA.repins_by_reason.unhealthy + statusA.repins_by_reason.failover).toBe(statusA.repins);
    expect(admin.repins).toBe(admin.replicas.reduce((n: number, r: { repins: number }) => n + r.repins, 0));
    for (const r of admin.replicas.filter((x: { url: string }) => x.url !== a)) expect(r).toMatchObject({ healthy: true, state: "healthy", failures: 0 });
    if (process.env.E8_VERBOSE) console.log(JSON.stringify(statusA));
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain(`edgeloop_gateway_replica_healthy{replica="${a}"} 0`);
    expect(metrics).toContain(`edgeloop_gateway_failures_total{replica="${a}",kind="client_abort"} ${statusA.failures}`);
    expect(metrics).toContain(`edgeloop_gateway_repins_total{replica="${a}",reason="unhealthy"} ${statusA.repins_by_reason.unhealthy}`);
  }, HANG_MS);

  test("flags override the config file; an invalid value is a config error naming the key (exit 2)", async () => {
    const { url } = await startGateway(["--replicas", sim.urls.join(","), "--attempt-timeout-ms", "2500", "--eject-after", "5"]);
    const admin = await (await fetch(`${url}/admin/replicas`, { headers: { authorization: "Bearer test-admin-token" } })).json();
    expect(admin.breaker).toEqual({ eject_after: 5, cooldown_ms: 10_000, attempt_timeout_ms: 2500 });
    const bad = Bun.spawnSync([process.execPath, MAIN, "gateway", "--replicas", sim.urls[0]!, "--port", "0", "--eject-after", "0"], { stdout: "pipe", stderr: "pipe" });
    expect(bad.exitCode).toBe(2);
    expect(bad.stderr.toString()).toBe("edgeloop: --eject-after must be an integer >= 1, got '0' (see edgeloop gateway --help)\n");
    const cfgPath = join(dir, "bad-gateway.yaml");
    writeFileSync(cfgPath, "gateway:\n  eject_after: 0\n");
    const badFile = Bun.spawnSync([process.execPath, MAIN, "gateway", "--replicas", sim.urls[0]!, "--port", "0", "--config", cfgPath], { stdout: "pipe", stderr: "pipe" });
    expect(badFile.exitCode).toBe(2);
    expect(badFile.stderr.toString()).toContain("gateway.eject_after");
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)
});
