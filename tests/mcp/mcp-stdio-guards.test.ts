import { expect, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { MAX_STDOUT_GARBAGE_LINES, stdioMcpTransport } from "../../infra/tools/mcp-stdio.ts";
import { waitFor } from "../helpers/wait.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Fresh-user findings on stdio MCP servers: a command flooding stdout hung edgeloop at full CPU past every deadline;
// a server that never answered initialize was left running after edgeloop gave up; one oversized reply failed every
// call in flight with "closed the connection before answering".
const HOSTILE = join(import.meta.dir, "hostile-stdio.ts");
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test("a command that floods stdout with lines that are not JSON-RPC is cut off, naming the cause, without retries", async () => {
  const spec = McpServerSpec.parse({ name: "flood", command: process.execPath, args: [HOSTILE, "flood"], timeout_ms: 60_000, max_retries: 2 });
  const e = await McpToolClient.connect([spec], { stdio: stdioMcpTransport, retryMinTimeoutMs: 1 }).catch((e) => e);
  expect(e.name).toBe("ToolError");
  expect(e.message).toBe(
    `MCP server 'flood' (${process.execPath}): cannot list its tools: MCP server 'flood' was disconnected: it wrote more than ${MAX_STDOUT_GARBAGE_LINES} lines that are not JSON-RPC to stdout (MCP's stdio transport allows only JSON-RPC messages there; log to stderr)`,
  );
});

test("a server that never answers initialize is stopped when edgeloop gives up on it, not left running", async () => {
  const dir = mkdtempSync(join(tmpdir(), "mcp-noinit-"));
  const pidFile = join(dir, "pid");
  // 8 s: the never-initializing child must have started (and written its pid) before edgeloop gives up, on a busy machine too.
  const spec = McpServerSpec.parse({ name: "mute", command: process.execPath, args: [HOSTILE, "noinit", pidFile], timeout_ms: 8_000, max_retries: 0 });
  const e = await McpToolClient.connect([spec], { stdio: stdioMcpTransport }).catch((e) => e);
  expect(e.message).toBe(`MCP server 'mute' (${process.execPath}): cannot list its tools: timed out after 8000 ms (1 attempt)`);
  const pid = Number(readFileSync(pidFile, "utf8"));
  expect(pid).toBeGreaterThan(0);
  // The transport's close ends stdin, then SIGTERM (the child ignores stdin's end, not SIGTERM): wait on the process itself.
  await waitFor(() => !alive(pid), "the never-initializing child to be stopped", HANG_MS);
  expect(alive(pid)).toBe(false);
});

test("a process that exits right after a failed start leaves no stdio child behind (the exit hook stops it)", async () => {
  const dir = mkdtempSync(join(tmpdir(), "mcp-exit-"));
  const pidFile = join(dir, "pid");
  const proc = Bun.spawn([process.execPath, join(import.meta.dir, "exit-after-failed-start.ts"), pidFile], { stdout: "pipe", stderr: "pipe" });
  expect(await proc.exited).toBe(2);
  expect(await new Response(proc.stderr).text()).toBe(`MCP server 'mute' (${process.execPath}): cannot list its tools: timed out after 8000 ms (1 attempt)\n`);
  const pid = Number(readFileSync(pidFile, "utf8"));
  expect(pid).toBeGreaterThan(0);
  // SIGKILL at the parent's exit is immediate; the wait only covers the kernel reaping it.
  await waitFor(() => !alive(pid), "the orphaned child to be gone", HANG_MS);
  expect(alive(pid)).toBe(false);
});

test("one reply over max_reply_bytes closes the stdio connection: every call in flight on it says why; the next call reconnects", async () => {
  const spec = McpServerSpec.parse({ name: "big", command: process.execPath, args: [HOSTILE, "big"], timeout_ms: 30_000, max_retries: 0, max_reply_bytes: 1024 * 1024 });
  const client = await McpToolClient.connect([spec], { stdio: stdioMcpTransport });
  try {
    const req = (name: string, index: number) => ({ name, arguments: {}, key: "k", turn: 1, index });
    const why = `MCP server 'big' was disconnected: a reply on stdout exceeded ${1024 * 1024 + 64 * 1024} bytes (the server's max_reply_bytes plus envelope): the stdio connection was closed, failing every call in flight on it`;
    const waiting = client.call(req("wait", 0));
    const big = await client.call(req("big", 1));
    expect(big).toEqual({ ok: false, call_id: "k:1:1", attempts: 1, content: `Error executing tool 'big': ${why}` });
    expect(await waiting).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: `Error executing tool 'wait': ${why}` });
    // A new connection (a new child) answers the next call; its tool list is the one listed at start.
    expect(await client.call(req("echo", 2))).toEqual({ ok: true, call_id: "k:1:2", attempts: 1, content: "ok" });
  } finally {
    await client.close();
  }
});
