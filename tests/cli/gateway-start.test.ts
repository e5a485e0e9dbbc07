import { afterAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { createGatewayApp } from "../../functions/gateway.ts";
import { ConfigError } from "../../shared/errors.ts";
import { NO_ATTEMPT_TIMEOUT_WARNING } from "../../infra/cli/engine-commands.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `edgeloop gateway` at start: no replica or a replica listed twice is refused (exit 2, one line
// naming --replicas); without an attempt timeout it warns, naming the flag and the config key.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const procs: ReturnType<typeof Bun.spawn>[] = [];
afterAll(() => {
  for (const p of procs) p.kill();
});

function gatewayRefused(replicas: string): { code: number; stderr: string; stdout: string } {
  const p = Bun.spawnSync([process.execPath, MAIN, "gateway", "--replicas", replicas, "--port", "0"], { stdout: "pipe", stderr: "pipe", timeout: HANG_MS });
  return { code: p.exitCode ?? -1, stderr: p.stderr.toString(), stdout: p.stdout.toString() };
}

/** Starts the gateway; resolves with its stdout banner line and what it printed on stderr before it. */
async function startGateway(args: string[]): Promise<{ banner: string; stderr: string }> {
  const p = Bun.spawn([process.execPath, MAIN, "gateway", ...args, "--port", "0"], { stdout: "pipe", stderr: "pipe" });
  procs.push(p);
  const reader = p.stdout.getReader();
  let out = "";
  while (!out.includes("\n")) {
    const { done, value } = await reader.read();
    if (done) throw new Error("gateway exited");
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  p.kill();
  const stderr = await new Response(p.stderr).text();
  return { banner: out.trim(), stderr };
}

describe("--replicas is refused at start when it names no replica or one twice", () => {
  const cases: [string, string][] = [
    ["", "edgeloop: --replicas: needs at least one replica base URL (comma-separated, e.g. http://127.0.0.1:8000,http://127.0.0.1:8001)\n"],
    [" , ", "edgeloop: --replicas: needs at least one replica base URL (comma-separated, e.g. http://127.0.0.1:8000,http://127.0.0.1:8001)\n"],
    ["http://127.0.0.1:8000,http://127.0.0.1:8000/", "edgeloop: --replicas: http://127.0.0.1:8000 is listed twice\n"],
    ["http://127.0.0.1:8000,localhost:8001", "edgeloop: --replicas: 'localhost:8001' is not an http(s) URL\n"],
  ];
  for (const [replicas, line] of cases) {
    test(JSON.stringify(replicas), () => {
      expect(gatewayRefused(replicas)).toEqual({ code: 2, stderr: line, stdout: "" });
    });
  }
  test("createGatewayApp refuses a replica listed twice too", () => {
    const e = (() => {
      try {
        createGatewayApp({ replicas: ["http://r1.test", "http://r1.test/"] });
      } catch (x) {
        return x;
      }
    })();
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as ConfigError).message).toBe("config gateway.replicas: http://r1.test is listed twice");
  });
});

describe("attempt timeout at start", () => {
  test("none: a warning naming --attempt-timeout-ms and gateway.attempt_timeout_ms; the banner says none", async () => {
    const { banner, stderr } = await startGateway(["--replicas", "http://127.0.0.1:9"]);
    expect(stderr).toBe(`${NO_ATTEMPT_TIMEOUT_WARNING}\n`);
    expect(NO_ATTEMPT_TIMEOUT_WARNING).toBe(
      "edgeloop gateway: warning: no attempt timeout (--attempt-timeout-ms, config gateway.attempt_timeout_ms): a hung replica holds each call until the client's own deadline (engine.timeout_ms, 600000 ms by default) instead of moving it to another replica; set it below engine.timeout_ms",
    );
    expect(banner).toContain("(least_inflight_sticky, 10000 sticky keys; attempt timeout none, eject after 3, cool-down 10000 ms, health checks every 5000 ms)");
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)
  test("set: no warning; the banner says it in ms", async () => {
    const { banner, stderr } = await startGateway(["--replicas", "http://127.0.0.1:9", "--attempt-timeout-ms", "2500"]);
    expect(stderr).toBe("");
    expect(banner).toContain("(least_inflight_sticky, 10000 sticky keys; attempt timeout 2500 ms, eject after 3, cool-down 10000 ms, health checks every 5000 ms)");
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)
});
