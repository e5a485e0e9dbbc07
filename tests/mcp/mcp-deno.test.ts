import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The MCP client is runtime-free: the same code under Deno, over Streamable HTTP and over stdio (which
// needs --allow-run there).
const ROOT = join(import.meta.dir, "..", "..");
let http: McpHttpServer;
beforeAll(() => {
  http = serveMcpHttp(() => createMcpToolsServer());
});
afterAll(() => http.stop());

test("McpToolClient under Deno: HTTP and stdio", async () => {
  const p = Bun.spawn(
    [join(ROOT, "node_modules", ".bin", "deno"), "run", "--allow-net", "--allow-read", "--allow-env", "--allow-sys", "--allow-run", join(import.meta.dir, "deno-client.ts"), http.url, process.execPath, join(ROOT, "infra", "tools", "mcp-server.ts"), "--stdio"],
    { cwd: ROOT, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } },
  );
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
  const ok = { ok: true, call_id: "deno:1:0", attempts: 1, content: "31" };
  expect(JSON.parse(out.trim().split("\n").at(-1)!)).toEqual({ names: [["calc", "lookup"], ["calc", "lookup"]], http: ok, stdio: ok });
}, HANG_MS);
