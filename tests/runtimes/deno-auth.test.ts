import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// S8 (security audit): the Deno entry fails closed as the Worker does. Without EDGELOOP_API_TOKEN it
// refuses /v1/* (403 auth_not_configured) unless EDGELOOP_ALLOW_ANONYMOUS=1, and it prints its auth
// state at start. Anonymous on loopback, it refuses non-loopback Host/Origin (DNS rebinding), as `serve`.
// Memory store, the in-process simulated engine, no tools: nothing else to start.

const procs: ReturnType<typeof Bun.spawn>[] = [];
// A tools file with no tools: the Deno entry cannot start the example tool server (a Bun server).
const dir = mkdtempSync(join(tmpdir(), "edgeloop-deno-auth-"));
const TOOLS = join(dir, "tools.json");
writeFileSync(TOOLS, JSON.stringify({ tools: [] }));
afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGTERM");
    await p.exited;
  }
  rmSync(dir, { recursive: true, force: true });
});

/** `deno task serve` with `env`; resolves with its URL and the stderr printed before it listened. */
async function deno(env: Record<string, string>): Promise<{ url: string; err: string }> {
  const p = Bun.spawn([join(ROOT, "node_modules", ".bin", "deno"), "task", "serve"], {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: "1", PORT: "0", EDGELOOP_TOOLS: TOOLS, EDGELOOP_API_TOKEN: "", EDGELOOP_ALLOW_ANONYMOUS: "", ...env },
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  procs.push(p);
  let err = "";
  const waiters: (() => void)[] = [];
  void (async () => {
    for await (const c of p.stderr as ReadableStream<Uint8Array>) {
      err += new TextDecoder().decode(c);
      for (const wake of waiters.splice(0)) wake();
    }
  })();
  const reader = (p.stdout as ReadableStream<Uint8Array>).getReader();
  let out = "";
  while (!/serving on (http:\/\/\S+)/.test(out)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`deno exited: ${out}${err}`);
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  // The auth line is written before the listen line: stderr is read until it is there.
  while (!err.includes("auth       ")) await new Promise<void>((r) => waiters.push(r));
  return { url: /serving on (http:\/\/\S+)/.exec(out)![1]!, err };
}

const ROW = JSON.stringify({ rows: [{ prompt: [{ role: "user", content: "What is 2+2?" }] }] });
const post = (headers: Record<string, string> = {}) => ({ method: "POST", headers: { "content-type": "application/json", ...headers }, body: ROW });

describe("S8: the Deno entry", () => {
  test("no token: /v1/* is 403 auth_not_configured, /health answers, the start says so", async () => {
    const { url, err } = await deno({});
    expect(err).toContain("auth       no EDGELOOP_API_TOKEN: /v1/* is refused (403 auth_not_configured); set EDGELOOP_API_TOKEN, or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth");
    const r = await fetch(`${url}/v1/rollouts`, post());
    expect([r.status, await r.json()]).toEqual([
      403,
      { error: { code: "auth_not_configured", message: "this Deno entry has no EDGELOOP_API_TOKEN, so /v1/* is refused: set EDGELOOP_API_TOKEN (a secret), or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth" } },
    ]);
    expect((await fetch(`${url}/v1/rollouts`)).status).toBe(403);
    expect((await fetch(`${url}/health`)).status).toBe(200);
  }, HANG_MS);

  test("EDGELOOP_ALLOW_ANONYMOUS=1: served, said at start; a rebinding Host or Origin is 403 forbidden_host", async () => {
    const { url, err } = await deno({ EDGELOOP_ALLOW_ANONYMOUS: "1" });
    expect(err).toContain("auth       NONE (EDGELOOP_ALLOW_ANONYMOUS=1): anyone who reaches this URL can submit batches and read group status");
    const r = await fetch(`${url}/v1/rollouts`, post());
    expect(r.status).toBe(202);
    await r.arrayBuffer();
    const port = new URL(url).port;
    const host = `rebind.attacker.example:${port}`;
    const rebound = await fetch(`${url}/v1/rollouts`, { headers: { host } });
    expect([rebound.status, ((await rebound.json()) as { error: { code: string; field: string } }).error]).toMatchObject([403, { code: "forbidden_host", field: "host" }]);
    expect((await fetch(`${url}/v1/rollouts`, { headers: { origin: "http://rebind.attacker.example" } })).status).toBe(403);
  }, HANG_MS);

  test("with EDGELOOP_API_TOKEN: 401 without it, served with it; the start says a token is required", async () => {
    const { url, err } = await deno({ EDGELOOP_API_TOKEN: "deno-token-1" });
    expect(err).toContain("auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)");
    expect(err).not.toContain("deno-token-1");
    expect((await fetch(`${url}/v1/rollouts`, post())).status).toBe(401);
    const ok = await fetch(`${url}/v1/rollouts`, post({ authorization: "Bearer deno-token-1" }));
    expect(ok.status).toBe(202);
    await ok.arrayBuffer();
  }, HANG_MS);
});
