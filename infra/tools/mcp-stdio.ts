import { StdioClientTransport, type StdioServerParameters } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { McpTransportFactory } from "../../shared/tools/mcp-tool-client.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES } from "../../shared/http/outbound.ts";

/** Room for the JSON-RPC envelope around a reply of `max_reply_bytes`, bytes. */
const ENVELOPE_BYTES = 64 * 1024;

/**
 * Lines on stdout that are not JSON-RPC a server may print before its connection is closed. MCP's stdio transport
 * allows only JSON-RPC messages on stdout ("The server MUST NOT write anything to its stdout that is not a valid MCP
 * message", spec 2025-06-18, Transports); a few stray lines (a banner) are tolerated, a flood is not: parsing it
 * starved the event loop, so that no deadline fired (`yes` as the command hung edgeloop at full CPU).
 */
export const MAX_STDOUT_GARBAGE_LINES = 100;

/** Every stdio server child still running, by pid: stopped when this process exits (see {@link stopChildrenAtExit}). */
const liveChildren = new Set<number>();
let exitHookInstalled = false;

/**
 * Installs (once) a `process.on("exit")` hook that SIGKILLs every stdio MCP
 * child still running. The SDK's close ends stdin, waits 2 s, then SIGTERMs:
 * a process that exits right after a failed start (`edgeloop rollout` exiting
 * 2) never got there, and a child that ignores stdin's end lived on with
 * ppid 1. A SIGKILL of edgeloop itself runs no hook; such a child ends when
 * it honours stdin's end (MCP servers should).
 */
function stopChildrenAtExit(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on("exit", () => {
    for (const pid of liveChildren) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  });
}

/**
 * The SDK's stdio transport with two guards. (1) More than
 * {@link MAX_STDOUT_GARBAGE_LINES} stdout lines that are not JSON-RPC close it:
 * the child is killed (SIGKILL) at once and every request on it fails with
 * `closeReason` naming the cause. (2) A line longer than its buffer (the
 * server's `max_reply_bytes` plus envelope) closes it too, with a reason that
 * says so — one stdio connection carries every call to its server, so every
 * call in flight on it fails with that reason.
 */
class GuardedStdioTransport extends StdioClientTransport {
  /** Why the transport closed itself, for the error of the requests it failed; undefined while none. */
  closeReason: string | undefined;
  private garbageLines = 0;
  private handler: ((e: Error) => void) | undefined;
  private guarding = false;

  constructor(
    params: StdioServerParameters,
    private readonly maxLineBytes: number,
  ) {
    super(params);
    // The SDK's Client assigns `onerror` after construction; the accessor sees every error the transport reports.
    Object.defineProperty(this, "onerror", {
      configurable: true,
      get: () => (e: Error) => this.guard(e),
      set: (fn: ((e: Error) => void) | undefined) => void (this.handler = fn),
    });
  }

  private guard(e: Error): void {
    // The SDK chains handlers (Protocol.connect reads `onerror`, which is this guard, and calls it from the handler it
    // sets): the inner call returns at once, so each error is reported once.
    if (this.guarding) return;
    this.guarding = true;
    try {
      this.check(e);
    } finally {
      this.guarding = false;
    }
  }

  private check(e: Error): void {
    if (this.closeReason !== undefined) return; // the flood after the trip is not reported line by line
    const message = String(e?.message ?? e);
    if (message.startsWith("ReadBuffer exceeded maximum size")) {
      this.trip(`a reply on stdout exceeded ${this.maxLineBytes} bytes (the server's max_reply_bytes plus envelope): the stdio connection was closed, failing every call in flight on it`);
      return;
    }
    // processReadBuffer reports a line it cannot parse (JSON.parse's SyntaxError, or zod's error for JSON that is not JSON-RPC).
    if (e instanceof SyntaxError || (e as { name?: string })?.name === "ZodError" || Array.isArray((e as { issues?: unknown })?.issues)) {
      if (++this.garbageLines > MAX_STDOUT_GARBAGE_LINES) {
        this.trip(`it wrote more than ${MAX_STDOUT_GARBAGE_LINES} lines that are not JSON-RPC to stdout (MCP's stdio transport allows only JSON-RPC messages there; log to stderr)`);
        return;
      }
    }
    this.handler?.(e);
  }

  override async start(): Promise<void> {
    stopChildrenAtExit();
    await super.start();
    const pid = this.pid;
    if (pid !== null) liveChildren.add(pid);
  }

  override async close(): Promise<void> {
    const pid = this.pid;
    try {
      await super.close();
    } finally {
      if (pid !== null) liveChildren.delete(pid);
    }
  }

  private trip(reason: string): void {
    this.closeReason = reason;
    const pid = this.pid;
    if (pid !== null) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    void this.close().catch(() => undefined);
  }
}

/**
 * The stdio transport of `command` MCP servers (the SDK's
 * `StdioClientTransport`, guarded: see {@link GuardedStdioTransport}): the
 * server runs as a child process with `args`, its working directory
 * edgeloop's own, its environment the SDK's safe defaults (`HOME`, `PATH`, …)
 * plus `env`, its stderr inherited (its log lines appear in edgeloop's). A
 * line longer than `max_reply_bytes` (default 4 MiB) plus 64 KiB of envelope
 * closes the connection: every call in flight on that server fails, naming
 * the cap. Runtimes with processes only (`serve`, `worker`, `rollout`);
 * Workers and Deno functions have none.
 */
export const stdioMcpTransport: McpTransportFactory = (server) => {
  const maxLineBytes = (server.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES) + ENVELOPE_BYTES;
  return new GuardedStdioTransport(
    {
      command: server.command!,
      args: server.args ?? [],
      ...(server.env ? { env: server.env } : {}),
      stderr: "inherit",
      maxBufferSize: maxLineBytes,
    },
    maxLineBytes,
  );
};
