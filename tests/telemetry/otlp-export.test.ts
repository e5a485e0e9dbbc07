import { afterAll, beforeAll, expect, test } from "bun:test";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setupTelemetryFromEnv } from "../../infra/telemetry/setup.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The edge wiring: `edgeloop rollout` with OTEL_EXPORTER_OTLP_ENDPOINT set sends its spans
// over OTLP/HTTP (JSON) to a collector, here a loopback server that keeps what it receives.
const ROOT = join(import.meta.dir, "..", "..");
const BIN = join(ROOT, "bin", "edgeloop.mjs");
let dir: string;
let collector: ReturnType<typeof Bun.serve>;
const received: { path: string; type: string | null; body: string }[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-otlp-"));
  cpSync(join(ROOT, "examples"), join(dir, "examples"), { recursive: true });
  writeFileSync(join(dir, "one.jsonl"), readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0] + "\n");
  collector = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      received.push({ path: new URL(req.url).pathname, type: req.headers.get("content-type"), body: await req.text() });
      return Response.json({});
    },
  });
});

afterAll(() => {
  collector.stop(true);
  rmSync(dir, { recursive: true, force: true });
});

test("without OTEL_EXPORTER_OTLP_ENDPOINT nothing is registered", () => {
  expect(setupTelemetryFromEnv({})).toBeNull();
  expect(setupTelemetryFromEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://x", OTEL_SDK_DISABLED: "true" })).toBeNull();
});

test("edgeloop rollout exports its spans to the OTLP/HTTP endpoint", async () => {
  // Async spawn: the collector answers from this process's event loop.
  const p = Bun.spawn(["node", BIN, "rollout", "--data", "one.jsonl", "--n", "2", "--no-progress"], {
    cwd: dir,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${collector.port}`, OTEL_SERVICE_NAME: "edgeloop-test" },
  });
  expect(await p.exited).toBe(0);
  expect(received.length).toBeGreaterThan(0);
  expect(received.every((r) => r.path === "/v1/traces" && r.type === "application/json")).toBe(true);
  const spans = received.flatMap((r) => JSON.parse(r.body).resourceSpans.flatMap((rs: any) => rs.scopeSpans.flatMap((ss: any) => ss.spans)));
  const names = spans.map((s: { name: string }) => s.name).sort();
  const count = (n: string) => names.filter((x: string) => x === n).length;
  expect([count("agent_loop.run"), count("agent_loop.turn"), count("inference.generate"), count("tool.call"), count("queue.put")]).toEqual([2, 4, 4, 2, 2]);
  expect(received[0]!.body).toContain('"stringValue":"edgeloop-test"');
}, HANG_MS); // a bound for a hang only: a CLI process start and a run, slow on a loaded machine
