/**
 * The services the end-to-end benchmark (`bench/e2e.ts`) talks to, run in a
 * child process so that their CPU time is not counted as edgeloop's and they
 * get the second core, as separate machines would:
 * - the example tool server (`infra/tools/`), optionally holding every call
 *   `--tool-delay-ms` ms;
 * - the simulated engine (`startSimEngine`, vLLM/SGLang wire formats) with the
 *   example policy, optionally answering every request after `--engine-latency-ms`
 *   (a replica-level `hang` fault with `ms`: a fixed per-request latency);
 * - with `--gateway`, the gateway (`functions/gateway.ts`) in front of it on its own port.
 *
 * Prints one JSON line `{tools_url, tools_port, engine_urls, gateway_url}` on
 * stdout once listening, then serves until SIGTERM/SIGINT or stdin closes.
 * `GET {tools_url}/__bench/stats` and `{engine_urls[0]}/__bench/stats` answer
 * `{inflight, max_inflight, requests, cpu_us}` (this process's CPU time)
 * and `POST …/__bench/reset` zeroes the counters.
 *
 *   bun bench/e2e-servers.ts --child --script examples/policy.json --seed 1 [--gateway] [--replicas K]
 *                            [--tool-delay-ms 1000] [--engine-latency-ms 200]
 *
 * Without `--child` (e.g. when a runner executes every `bench/*.ts`) it prints
 * what it is and exits 0.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createGatewayApp } from "../functions/gateway.ts";
import { startSimEngine } from "../infra/sim-engine/server.ts";
import { createToolsApp } from "../infra/tools/app.ts";

if (!process.argv.includes("--child")) {
  console.log("bench/e2e-servers.ts is a helper of bench/e2e.ts (run that one)");
  process.exit(0);
}

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: {
    child: { type: "boolean", default: false },
    script: { type: "string" },
    seed: { type: "string" },
    replicas: { type: "string", default: "1" },
    gateway: { type: "boolean", default: false },
    "tool-delay-ms": { type: "string", default: "0" },
    "engine-latency-ms": { type: "string", default: "0" },
  },
});

/** In-flight and total counts of one served app, for `/__bench/stats`. */
interface Counter {
  inflight: number;
  max_inflight: number;
  requests: number;
}

/**
 * Wraps a fetch handler with request counters and the `/__bench/*` routes.
 * Counting here (not in the apps) keeps the product code free of bench hooks.
 */
function counted(fetch: (req: Request) => Response | Promise<Response>): { fetch: (req: Request) => Promise<Response>; c: Counter } {
  const c: Counter = { inflight: 0, max_inflight: 0, requests: 0 };
  return {
    c,
    async fetch(req: Request) {
      const path = new URL(req.url).pathname;
      if (path === "/__bench/stats") {
        const u = process.cpuUsage();
        return Response.json({ ...c, cpu_us: u.user + u.system });
      }
      if (path === "/__bench/reset") {
        c.inflight = 0;
        c.max_inflight = 0;
        c.requests = 0;
        return Response.json({ ok: true });
      }
      c.requests++;
      c.inflight++;
      if (c.inflight > c.max_inflight) c.max_inflight = c.inflight;
      try {
        return await fetch(req);
      } finally {
        c.inflight--;
      }
    },
  };
}

const toolDelay = Number(values["tool-delay-ms"]);
const engineLatency = Number(values["engine-latency-ms"]);
let script: Record<string, unknown> = values.script ? JSON.parse(readFileSync(values.script, "utf8")) : {};
if (values.seed !== undefined) script = { ...script, seed: Number(values.seed) };

const tools = counted(createToolsApp({ delayMs: toolDelay, dedupeSize: 200_000 }).fetch);
// A held call must not be cut by the server's idle timeout (Bun's default is 10 s).
const toolServer = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: tools.fetch, idleTimeout: 0 });

const replicas = Number(values.replicas);
const sim = await startSimEngine({
  replicas,
  script,
  faults: engineLatency > 0 ? Array.from({ length: replicas }, () => ({ kind: "hang" as const, ms: engineLatency })) : undefined,
});
// Re-serve replica 0 behind the counter: stop its server and bind the same port with the wrapped app.
const engine = counted((req) => sim.replicas[0]!.app.fetch(req));
await sim.replicas[0]!.kill();
const engineServer = Bun.serve({ hostname: "127.0.0.1", port: sim.replicas[0]!.port, fetch: engine.fetch, idleTimeout: 0 });

let gatewayServer: ReturnType<typeof Bun.serve> | undefined;
if (values.gateway) {
  const gw = createGatewayApp({ replicas: sim.urls, policy: "least_inflight_sticky", healthIntervalMs: 0 });
  gatewayServer = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: gw.fetch, idleTimeout: 0 });
}

console.log(
  JSON.stringify({
    tools_url: `http://127.0.0.1:${toolServer.port}`,
    tools_port: toolServer.port,
    engine_urls: sim.urls,
    gateway_url: gatewayServer ? `http://127.0.0.1:${gatewayServer.port}` : null,
  }),
);

const stop = async () => {
  await gatewayServer?.stop(true);
  await engineServer.stop(true);
  await sim.stop();
  await toolServer.stop(true);
  process.exit(0);
};
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.resume();
