import { afterAll, describe, expect, test } from "bun:test";
import { startGatewayProcess } from "../helpers/gateway-process.ts";
import { join } from "node:path";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { HANG_MS } from "../helpers/bounds.ts";

// `edgeloop gateway` takes its admin token from EDGELOOP_ADMIN_TOKEN: /admin/* then needs it, proxied calls do not.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const TOKEN = "gw-admin-token-7f3a";
const procs: ReturnType<typeof Bun.spawn>[] = [];
afterAll(async () => {
  for (const p of procs) {
    p.kill("SIGTERM");
    await p.exited;
  }
});

async function startGateway(env: Record<string, string | undefined>): Promise<{ url: string; banner: string }> {
  return startGatewayProcess(["--replicas", "http://127.0.0.1:9", "--port", "0"], procs, env);
}

describe("edgeloop gateway admin token", () => {
  test("with EDGELOOP_ADMIN_TOKEN, /admin/* is 401 without the bearer token and 200 with it; the banner does not print it", async () => {
    const { url, banner } = await startGateway({ EDGELOOP_ADMIN_TOKEN: TOKEN });
    expect(banner).toContain("/admin/* needs the bearer token from EDGELOOP_ADMIN_TOKEN");
    expect(banner).not.toContain(TOKEN);
    const none = await fetch(`${url}/admin/replicas`);
    expect(none.status).toBe(401);
    expect(await none.json()).toEqual({ error: { code: "unauthorized", message: "missing or wrong bearer token" } });
    expect((await fetch(`${url}/admin/replicas`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401);
    const ok = await fetch(`${url}/admin/replicas`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { replicas: { url: string }[] }).replicas.map((r) => r.url)).toEqual(["http://127.0.0.1:9"]);
    expect((await fetch(`${url}/health`)).status).not.toBe(401);
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)

  test("S6: without it, /admin/* is off (403 admin_disabled, even with a bearer token) and the banner says so", async () => {
    const { url, banner } = await startGateway({ EDGELOOP_ADMIN_TOKEN: "" });
    expect(banner).toContain("/admin/* is off (set EDGELOOP_ADMIN_TOKEN to enable it behind a bearer token)");
    expect(banner).toContain("forwards only POST /v1/completions, POST /inference/v1/generate, POST /generate, POST /tokenize, POST /v1/tokenize, GET /v1/models;");
    for (const init of [{}, { headers: { authorization: "Bearer anything" } }]) {
      const res = await fetch(`${url}/admin/replicas`, init);
      expect(res.status).toBe(403);
      expect(await res.json()).toEqual({
        error: { code: "admin_disabled", message: "the gateway's admin API is off: start it with EDGELOOP_ADMIN_TOKEN set to enable /admin/* behind that bearer token" },
      });
    }
    const add = await fetch(`${url}/admin/replicas`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ url: "http://127.0.0.1:18951" }) });
    expect(add.status).toBe(403);
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)

  test("S12: the admin token can come from a file (EDGELOOP_ADMIN_TOKEN_FILE)", async () => {
    const file = join(mkdtempSync(join(tmpdir(), "edgeloop-admin-")), "token");
    writeFileSync(file, `${TOKEN}\n`);
    const { url, banner } = await startGateway({ EDGELOOP_ADMIN_TOKEN: "", EDGELOOP_ADMIN_TOKEN_FILE: file });
    expect(banner).toContain("/admin/* needs the bearer token from EDGELOOP_ADMIN_TOKEN");
    expect((await fetch(`${url}/admin/replicas`)).status).toBe(401);
    expect((await fetch(`${url}/admin/replicas`, { headers: { authorization: `Bearer ${TOKEN}` } })).status).toBe(200);
  }, HANG_MS); // a bound for a hang only (process starts on a loaded machine)
});
