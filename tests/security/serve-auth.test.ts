import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawnServe, type CliProc } from "../chaos/store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");

// S7 (security audit): a token-less `serve` is for this machine only. It binds loopback (another
// --host is refused unless --insecure-no-auth), refuses requests whose Host or Origin is not a
// loopback name (DNS rebinding), and says so loudly at start. With EDGELOOP_API_TOKEN (or
// EDGELOOP_API_TOKEN_FILE) it may bind anywhere and checks the bearer token instead.

const procs: CliProc[] = [];
const dir = mkdtempSync(join(tmpdir(), "edgeloop-serve-auth-"));
afterAll(async () => {
  for (const p of procs) {
    p.proc.kill("SIGTERM");
    await p.proc.exited;
  }
  rmSync(dir, { recursive: true, force: true });
});

const NO_TOKEN = { EDGELOOP_API_TOKEN: "", EDGELOOP_API_TOKEN_FILE: "" };
const LOOPBACK_LINE =
  "auth       NONE: no EDGELOOP_API_TOKEN, so this server is for this machine only: bound to loopback, Host and Origin must be 127.0.0.1, localhost or [::1] (set EDGELOOP_API_TOKEN to serve others)";
const forbidden = (field: "host" | "origin", value: string) => ({
  error: {
    code: "forbidden_host",
    message: `${field} '${value}' is not a loopback name: without EDGELOOP_API_TOKEN this server answers only requests to 127.0.0.1, localhost or [::1] (DNS-rebinding guard); set EDGELOOP_API_TOKEN to serve other names`,
    field,
  },
});

async function serve(args: string[], env: Record<string, string>): Promise<CliProc & { url: string }> {
  const p = await spawnServe(args, env);
  procs.push(p);
  return { ...p, url: p.url.replace("//0.0.0.0:", "//127.0.0.1:") };
}

/** Runs `edgeloop serve …` expected to refuse to start: its exit code and stderr. */
async function refused(args: string[], env: Record<string, string>): Promise<[number, string]> {
  const proc = Bun.spawn([process.execPath, MAIN, "serve", "--port", "0", ...args], { stdout: "ignore", stderr: "pipe", env: { ...process.env, ...env } });
  const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
  return [code, err.trim()];
}

describe("S7: token-less serve", () => {
  let base = "";
  let port = "";
  test("start: loopback bind, the loud auth line", async () => {
    const s = await serve([], NO_TOKEN);
    base = s.url;
    port = new URL(base).port;
    expect(new URL(base).hostname).toBe("127.0.0.1");
    expect(s.err().split("\n")).toContain(LOOPBACK_LINE);
    // S23: the memory store never frees, and a serve on it says so.
    expect(s.err().split("\n")).toContain(
      "warning    memory store: every batch, record and group stays in this process's memory until it exits (nothing is freed); for a long-running serve use --store redis://… and `edgeloop gc`",
    );
  }, HANG_MS);

  test("the audit's repro: Host/Origin of a rebinding domain are 403 forbidden_host; the engines are not paused", async () => {
    const host = `rebind.attacker.example:${port}`;
    const pause = await fetch(`${base}/v1/engine/pause`, { method: "POST", headers: { host, origin: `http://${host}`, "content-type": "application/json" }, body: '{"mode":"keep"}' });
    expect([pause.status, await pause.json()]).toEqual([403, forbidden("host", host)]);
    const list = await fetch(`${base}/v1/rollouts`, { headers: { host } });
    expect([list.status, await list.json()]).toEqual([403, forbidden("host", host)]);
    // Every route, public ones included (the store's address in /health, the viewer).
    for (const path of ["/health", "/metrics", "/viewer", "/openapi.json", "/v1/sessions/k_0_0/tool-results"]) {
      expect([path, (await fetch(`${base}${path}`, { headers: { host } })).status]).toEqual([path, 403]);
    }
    // A loopback Host with a foreign Origin (a page elsewhere posting to 127.0.0.1) is refused too.
    const origin = await fetch(`${base}/v1/engine/pause`, { method: "POST", headers: { origin: "http://rebind.attacker.example", "content-type": "application/json" }, body: '{"mode":"keep"}' });
    expect([origin.status, await origin.json()]).toEqual([403, forbidden("origin", "http://rebind.attacker.example")]);
    const nullOrigin = await fetch(`${base}/v1/rollouts`, { headers: { origin: "null" } });
    expect([nullOrigin.status, await nullOrigin.json()]).toEqual([403, forbidden("origin", "null")]);
    const status = await fetch(`${base}/v1/engine/status`);
    expect(status.status).toBe(200);
    expect(((await status.json()) as { paused: boolean }).paused).toBe(false);
  });

  test("loopback names pass: 127.0.0.1, localhost, [::1], 127.1.2.3, any port; loopback origins too", async () => {
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, "localhost", `[::1]:${port}`, "127.1.2.3:9", "LOCALHOST", "app.localhost:1"]) {
      expect([host, (await fetch(`${base}/v1/rollouts`, { headers: { host } })).status]).toEqual([host, 200]);
    }
    for (const origin of [`http://127.0.0.1:${port}`, `http://localhost:${port}`, "https://localhost", "http://[::1]:3000"]) {
      expect([origin, (await fetch(`${base}/v1/rollouts`, { headers: { origin } })).status]).toEqual([origin, 200]);
    }
    // Names that only look loopback are not.
    for (const host of ["127.0.0.1.attacker.example", "localhost.attacker.example", "0.0.0.0", "[::ffff:7f00:1]", "127.0.0.256"]) {
      expect([host, (await fetch(`${base}/v1/rollouts`, { headers: { host } })).status]).toEqual([host, 403]);
    }
  });

  test("a non-loopback --host without a token is refused (exit 2, naming --host)", async () => {
    for (const host of ["0.0.0.0", "::", "192.0.2.1"]) {
      const [code, err] = await refused(["--host", host], NO_TOKEN);
      expect([host, code]).toEqual([host, 2]);
      expect(err).toBe(
        `edgeloop: --host: ${host} is not a loopback address and no EDGELOOP_API_TOKEN is set: anyone reaching it could submit batches, read trajectories and pause engines. Set EDGELOOP_API_TOKEN (or EDGELOOP_API_TOKEN_FILE), or pass --insecure-no-auth to serve without auth anyway`,
      );
    }
  }, HANG_MS);

  test("--insecure-no-auth: binds 0.0.0.0, says so, answers any Host", async () => {
    const s = await serve(["--host", "0.0.0.0", "--insecure-no-auth"], NO_TOKEN);
    expect(s.err().split("\n")).toContain(
      "auth       NONE on 0.0.0.0 (--insecure-no-auth): anyone who reaches this address can submit batches, read trajectories and pause engines",
    );
    expect((await fetch(`${s.url}/v1/rollouts`, { headers: { host: "edgeloop.internal:8787" } })).status).toBe(200);
  }, HANG_MS);

  test("--insecure-no-auth on a loopback bind keeps the DNS-rebinding guard (a foreign Host is still 403)", async () => {
    const s = await serve(["--insecure-no-auth"], NO_TOKEN);
    const evil = await fetch(`${s.url}/v1/rollouts`, { headers: { host: "evil.example" } });
    expect([evil.status, ((await evil.json()) as { error: { code: string } }).error.code]).toEqual([403, "forbidden_host"]);
    expect((await fetch(`${s.url}/v1/rollouts`)).status).toBe(200);
  }, HANG_MS);
});

describe("S7: serve with a token", () => {
  test("binds 0.0.0.0; no Host check, the bearer token instead; the token may come from EDGELOOP_API_TOKEN_FILE", async () => {
    const file = join(dir, "api-token");
    writeFileSync(file, "file-token-123\n");
    const s = await serve(["--host", "0.0.0.0"], { EDGELOOP_API_TOKEN: "", EDGELOOP_API_TOKEN_FILE: file });
    expect(s.err().split("\n")).toContain("auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)");
    const host = { host: "edgeloop.internal:8787" };
    expect((await fetch(`${s.url}/v1/rollouts`, { headers: host })).status).toBe(401);
    expect((await fetch(`${s.url}/v1/rollouts`, { headers: { ...host, authorization: "Bearer file-token-123" } })).status).toBe(200);
    // S15: /metrics, /health, /openapi.json and the viewer are public by default.
    for (const path of ["/metrics", "/health", "/openapi.json", "/viewer"]) expect([path, (await fetch(`${s.url}${path}`)).status]).toEqual([path, 200]);
  }, HANG_MS);

  test("S15: --metrics-auth puts /metrics behind the token (and needs one)", async () => {
    const s = await serve(["--metrics-auth"], { EDGELOOP_API_TOKEN: "metrics-token", EDGELOOP_API_TOKEN_FILE: "" });
    const none = await fetch(`${s.url}/metrics`);
    expect([none.status, await none.json()]).toEqual([401, { error: { code: "unauthorized", message: "missing or wrong bearer token" } }]);
    const ok = await fetch(`${s.url}/metrics`, { headers: { authorization: "Bearer metrics-token" } });
    expect([ok.status, ok.headers.get("content-type")]).toEqual([200, "text/plain; version=0.0.4; charset=utf-8"]);
    await ok.arrayBuffer();
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
    expect(await refused(["--metrics-auth"], NO_TOKEN)).toEqual([2, "edgeloop: --metrics-auth: puts /metrics behind EDGELOOP_API_TOKEN, which is not set"]);
  }, HANG_MS);

  test("a token and --insecure-no-auth together are refused; both EDGELOOP_API_TOKEN and _FILE too", async () => {
    expect(await refused(["--insecure-no-auth"], { EDGELOOP_API_TOKEN: "t", EDGELOOP_API_TOKEN_FILE: "" })).toEqual([
      2,
      "edgeloop: --insecure-no-auth: EDGELOOP_API_TOKEN is set: the API requires it, so --insecure-no-auth would not apply",
    ]);
    expect(await refused([], { EDGELOOP_API_TOKEN: "t", EDGELOOP_API_TOKEN_FILE: join(dir, "api-token") })).toEqual([
      2,
      "edgeloop: EDGELOOP_API_TOKEN: set either EDGELOOP_API_TOKEN or EDGELOOP_API_TOKEN_FILE, not both",
    ]);
    expect(await refused([], { EDGELOOP_API_TOKEN: "", EDGELOOP_API_TOKEN_FILE: join(dir, "missing") })).toEqual([
      2,
      `edgeloop: EDGELOOP_API_TOKEN_FILE: cannot read ${join(dir, "missing")}: ENOENT`,
    ]);
  }, HANG_MS);
});
