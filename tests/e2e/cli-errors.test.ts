import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// What a first-time user hits when something is wrong: one clear line and a meaningful exit code,
// never a stack trace or a hang. The CLI runs as a child process (bun infra/cli/main.ts) in a temporary directory.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
let dir: string;

function edgeloop(args: string[], env: Record<string, string> = {}): { code: number; stdout: string; stderr: string } {
  const p = Bun.spawnSync([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "", ...env }, timeout: HANG_MS });
  return { code: p.exitCode ?? -1, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

/** The same, without blocking this process (for tests that serve something the CLI calls). */
async function edgeloopAsync(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "", ...env } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

const lines = (s: string) => s.trim().split("\n");
const noStack = (s: string) => expect(s).not.toMatch(/^\s+at /m);

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-cli-errors-"));
  const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n");
  writeFileSync(join(dir, "two.jsonl"), rows.slice(0, 2).join("\n") + "\n");
  writeFileSync(join(dir, "hello.jsonl"), "hello world\n");
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("unreachable stores at start: rollout fails at once (exit 2); serve and worker wait, bounded by --store-timeout (exit 1)", () => {
  test("rollout, serve, worker with --store redis://127.0.0.1:1; upstash-bridge with --redis", () => {
    const line = "edgeloop: cannot reach Redis at redis://127.0.0.1:1 (store.url / --store): connect ECONNREFUSED 127.0.0.1:1";
    const r = edgeloop(["rollout", "--data", "two.jsonl", "--n", "2", "--store", "redis://127.0.0.1:1"]);
    expect({ code: r.code, stderr: r.stderr.trim() }).toEqual({ code: 2, stderr: line });
    for (const args of [["serve", "--port", "0"], ["worker"]]) {
      const w = edgeloop([...args, "--store", "redis://127.0.0.1:1", "--store-timeout", "1"]);
      expect({ code: w.code, stderr: w.stderr.trim().split("\n") }).toEqual({
        code: 1,
        stderr: [
          "edgeloop: cannot reach Redis at redis://127.0.0.1:1 (store.url / --store): connect ECONNREFUSED 127.0.0.1:1; waiting for it for up to 1 s (--store-timeout)",
          expect.stringMatching(/^edgeloop: cannot reach Redis at redis:\/\/127\.0\.0\.1:1 \(store\.url \/ --store\): connect ECONNREFUSED 127\.0\.0\.1:1; unreachable for [12] s at start \(--store-timeout 1\); exiting$/),
        ],
      });
    }
    const b = edgeloop(["upstash-bridge", "--port", "0", "--token", "t", "--redis", "redis://:hunter2@127.0.0.1:1"]);
    expect({ code: b.code, stderr: b.stderr.trim() }).toEqual({ code: 2, stderr: "edgeloop: cannot reach Redis at redis://:***@127.0.0.1:1 (--redis): connect ECONNREFUSED 127.0.0.1:1" });
  }, HANG_MS);

  test("an Upstash store that answers 401", async () => {
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json({ error: "Unauthorized" }, { status: 401 }) });
    try {
      const url = `http://127.0.0.1:${server.port}`;
      const r = await edgeloopAsync(["rollout", "--data", "two.jsonl", "--store", "upstash"], { UPSTASH_REDIS_REST_URL: url, UPSTASH_REDIS_REST_TOKEN: "bad" });
      expect(r.code).toBe(2);
      expect(r.stderr.trim()).toBe(`edgeloop: the Upstash store at ${url} refused the token (401 Unauthorized): check UPSTASH_REDIS_REST_TOKEN`);
    } finally {
      server.stop(true);
    }
  }, HANG_MS);
});

describe("rollout exit codes", () => {
  test("an engine URL that does not answer: a warning before the run, every trajectory fails, exit 1", () => {
    const r = edgeloop(["rollout", "--data", "two.jsonl", "--n", "1", "--engine", "http://127.0.0.1:1", "--engine-format", "vllm", "--no-progress"]);
    expect(r.code).toBe(1);
    const err = lines(r.stderr);
    const warn = err.findIndex((l) => l.startsWith("warning    engine http://127.0.0.1:1 does not answer (GET http://127.0.0.1:1/v1/models: "));
    expect(warn).toBeGreaterThan(-1);
    expect(warn).toBeLessThan(err.findIndex((l) => l.startsWith("batch ")));
    expect(err.at(-1)).toBe("edgeloop: no trajectory succeeded (2 of 2 failed); see the errors above");
    noStack(r.stderr);
  }, HANG_MS);

  test("a data file whose only line is not JSON: a warning naming the line, exit 1", () => {
    const r = edgeloop(["rollout", "--data", "hello.jsonl", "--n", "2", "--no-progress"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`warning    line 1 of hello.jsonl is not valid JSON: JSON Parse error: Unexpected identifier "hello"; that row (rows[0]) fails\n`);
    expect(r.stderr).toContain("batch      ");
    expect(r.stderr).toMatch(/: 1 rows x n=2 -> 2 trajectories\n/);
    expect(lines(r.stderr).at(-1)).toBe("edgeloop: no trajectory succeeded (2 of 2 failed); see the errors above");
  }, HANG_MS);

  test("invalid names fail at start, exit 2", () => {
    writeFileSync(join(dir, "xml.yaml"), "rollout:\n  multi_turn:\n    format: xml\n");
    const f = edgeloop(["rollout", "--data", "two.jsonl", "--config", "xml.yaml"]);
    expect({ code: f.code, stderr: f.stderr.trim() }).toEqual({ code: 2, stderr: "edgeloop: config rollout.multi_turn.format: unknown tool-call parser 'xml'; registered parsers: deepseek_v3, harmony, hermes, llama3_json, pythonic, qwen3_coder" });
    const a = edgeloop(["rollout", "--data", "two.jsonl", "--default-agent", "nope"]);
    expect({ code: a.code, stderr: a.stderr.trim() }).toEqual({
      code: 2,
      stderr: "edgeloop: config rollout.agent.default_agent_loop: unknown agent loop 'nope'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
    });
    const debug = edgeloop(["rollout", "--data", "two.jsonl", "--default-agent", "nope"], { EDGELOOP_DEBUG: "1" });
    expect(lines(debug.stderr)[0]).toBe(lines(a.stderr)[0]!);
    expect(debug.stderr).toMatch(/^\s+at .*runtime\.ts/m);
    writeFileSync(join(dir, "rows.csv"), "a\n");
    const c = edgeloop(["rollout", "--data", "rows.csv"]);
    expect({ code: c.code, stderr: c.stderr.trim() }).toEqual({ code: 2, stderr: "edgeloop: --data: rows.csv: unknown file type '.csv'; accepted: .jsonl, .ndjson, .json, .parquet" });
  }, HANG_MS);

  test("--engine-format vllm-generate is accepted (sim replicas behind the gateway speak it)", () => {
    const r = edgeloop(["rollout", "--data", "two.jsonl", "--n", "2", "--replicas", "2", "--engine-format", "vllm-generate", "--no-progress"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^ {2}ok {21}4$/m);
  }, HANG_MS);

  test("SIGINT keeps what finished: 'interrupted: N of M records written to FILE', partial summary, exit 130", async () => {
    writeFileSync(join(dir, "hang.json"), JSON.stringify({ seed: 1, rules: [{ when: "HANG", turns: ["x"], fault: { kind: "hang" } }], default: ["The answer is 1.\n#### 1"] }));
    writeFileSync(join(dir, "h.jsonl"), ['{"prompt":[{"role":"user","content":"quick"}]}', '{"prompt":[{"role":"user","content":"HANG"}]}'].join("\n") + "\n");
    const p = Bun.spawn([process.execPath, MAIN, "rollout", "--data", "h.jsonl", "--n", "1", "--script", "hang.json", "--out", "h-out.jsonl", "--no-progress"], {
      cwd: dir,
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, NO_COLOR: "1" },
    });
    const reader = p.stderr.getReader();
    let err = "";
    while (!err.includes("progress   1/2")) {
      const { done, value } = await reader.read();
      if (done) break;
      err += new TextDecoder().decode(value);
    }
    p.kill("SIGINT");
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      err += new TextDecoder().decode(value);
    }
    const code = await p.exited;
    const out = await new Response(p.stdout).text();
    expect(code).toBe(130);
    expect(lines(err).at(-1)).toBe("interrupted: 1 of 2 records written to h-out.jsonl (SIGINT)");
    expect(out).toMatch(/^ {2}ok {21}1$/m);
    expect(readFileSync(join(dir, "h-out.jsonl"), "utf8").trim().split("\n").length).toBe(1);
  }, HANG_MS);
});

describe("flags and ports", () => {
  test("tools is a real subcommand: --help, unknown flag and bad port without stack traces", () => {
    const h = edgeloop(["tools", "--help"]);
    expect(h.code).toBe(0);
    expect(h.stdout).toContain("--port <port>      port (default: 8123)");
    expect(h.stdout).toContain('--host <host>      address to bind (default: "127.0.0.1")');
    const bogus = edgeloop(["tools", "--bogus"]);
    expect(bogus.code).toBe(2);
    expect(bogus.stderr).toBe("edgeloop: unknown option '--bogus' (see edgeloop tools --help)\n");
    const bad = edgeloop(["tools", "--port", "abc"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe("edgeloop: --port must be an integer 0..65535, got 'abc' (see edgeloop tools --help)\n");
    for (const r of [h, bogus, bad]) noStack(r.stderr);
  }, HANG_MS);

  test("sim-engine --port 65535 --replicas 2: one line naming --port, exit 2 (not a RangeError)", () => {
    const r = edgeloop(["sim-engine", "--port", "65535", "--replicas", "2"]);
    expect([r.code, r.stderr]).toEqual([2, "edgeloop: --port: 65535 with --replicas 2 needs ports 65535..65536, past 65535: use --port 65534 or lower (or --port 0 for free ports)\n"]);
    noStack(r.stderr);
  }, HANG_MS);

  test("a port in use: one line, exit 2, for serve, sim-engine, gateway, tools and upstash-bridge", () => {
    const busy = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("busy") });
    try {
      const port = String(busy.port);
      const line = `edgeloop: port ${port} is already in use (another process listens on it; pick another with --port)`;
      for (const args of [
        ["serve", "--port", port],
        ["sim-engine", "--port", port],
        ["gateway", "--replicas", "http://127.0.0.1:9", "--port", port],
        ["tools", "--port", port],
        ["upstash-bridge", "--port", port, "--token", "t"],
      ]) {
        const r = edgeloop(args);
        expect({ args, code: r.code, stderr: lines(r.stderr).at(-1) }).toEqual({ args, code: 2, stderr: line });
        noStack(r.stderr);
      }
    } finally {
      busy.stop(true);
    }
  }, HANG_MS);
});
