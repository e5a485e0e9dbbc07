import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js";
import type { CreateTaskOptions, TaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/interfaces.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema, type CallToolResult, type Request, type RequestId, type Result, type Task } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { calcToolContent } from "../../infra/tools/calc.ts";
import { DEFAULT_FACTS, lookupFact } from "../../infra/tools/lookup.ts";
import example from "../../infra/tools/tools.example.json" with { type: "json" };

/** What the fixture server saw: every tools/call's name and `_meta`. */
export interface FixtureLog {
  calls: { name: string; meta: Record<string, unknown> }[];
}

/**
 * An MCP server built with the SDK's `McpServer`, one tool per result shape
 * edgeloop maps: text, two text parts, structured content (with and without
 * text), `isError`, an image, a tool that kills the server mid-call
 * (`onCrash`), one that hangs until cancelled or 2 s (`slow`), and `flaky`
 * (annotated `idempotentHint`) that hangs on the first attempt of a call id
 * and answers the second.
 */
export function fixtureServer(log: FixtureLog, onCrash: () => void): McpServer {
  const server = new McpServer({ name: "fixture", version: "1.0.0" }, { capabilities: { logging: {} } });
  const record = (name: string, meta: Record<string, unknown> | undefined) => log.calls.push({ name, meta: { ...(meta ?? {}) } });
  const hang = (signal: AbortSignal) =>
    new Promise<void>((resolve) => {
      const t = setTimeout(resolve, 2000);
      signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
    });
  server.registerTool("echo", { description: "Echo the text.", inputSchema: { text: z.string() } }, ({ text }, extra) => {
    record("echo", extra._meta);
    return { content: [{ type: "text", text }] };
  });
  server.registerTool("two_parts", { description: "Two text parts." }, (extra) => {
    record("two_parts", extra._meta);
    return { content: [{ type: "text", text: "first" }, { type: "text", text: "second" }] };
  });
  server.registerTool(
    "stats",
    { description: "Count and sum.", inputSchema: { values: z.array(z.number()) }, outputSchema: { count: z.number(), sum: z.number() } },
    ({ values }, extra) => {
      record("stats", extra._meta);
      return { content: [], structuredContent: { count: values.length, sum: values.reduce((a, b) => a + b, 0) } };
    },
  );
  server.registerTool("stats_text", { description: "Structured content with a text part." }, (extra) => {
    record("stats_text", extra._meta);
    return { content: [{ type: "text", text: "count 2" }], structuredContent: { count: 2 } };
  });
  server.registerTool("fail", { description: "Always fails." }, (extra) => {
    record("fail", extra._meta);
    return { content: [{ type: "text", text: "division by zero" }], isError: true };
  });
  server.registerTool("picture", { description: "An image." }, (extra) => {
    record("picture", extra._meta);
    return { content: [{ type: "text", text: "here:" }, { type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" }] };
  });
  server.registerTool("crash", { description: "Kills the server mid-call." }, async (extra) => {
    record("crash", extra._meta);
    // A log line first: over HTTP it opens the call's SSE stream (headers and one event sent), then the server dies mid-stream.
    await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: "crashing" } });
    onCrash();
    await hang(extra.signal);
    return { content: [{ type: "text", text: "unreachable" }] };
  });
  server.registerTool("slow", { description: "Hangs." }, async (extra) => {
    record("slow", extra._meta);
    await hang(extra.signal);
    return { content: [{ type: "text", text: "late" }] };
  });
  server.registerTool("flaky", { description: "Hangs on a call id's first attempt.", annotations: { idempotentHint: true } }, async (extra) => {
    record("flaky", extra._meta);
    const id = extra._meta?.["edgeloop/call_id"];
    const n = log.calls.filter((c) => c.name === "flaky" && c.meta["edgeloop/call_id"] === id).length;
    if (n === 1) await hang(extra.signal);
    return { content: [{ type: "text", text: `answered attempt ${n}` }] };
  });
  return server;
}

if (import.meta.main) {
  // `bun tests/mcp/fixture-server.ts`: the fixture over stdio; `crash` exits the process.
  await fixtureServer({ calls: [] }, () => process.exit(1)).connect(new StdioServerTransport());
}

/** What {@link taskToolsServer} saw: per `edgeloop/call_id`, the tools/call executions it started, and the task ids it made. */
export interface TaskLog {
  executions: Map<string, number>;
  /** Every tools/call: its call id, the task the server made for it, and whether the client asked for a task (`params.task`). */
  tasks: { call_id: string; task_id: string; augmented: boolean }[];
}

/**
 * The SDK's `InMemoryTaskStore` shared by every MCP session of a server, as a
 * durable server's store is: it ignores session ids (the in-memory store binds
 * a task to the session that made it, and a resumed trajectory polls from a new
 * session). Counts `tasks/get`-side reads (`getTask`) and `getTaskResult`s per task id.
 */
export class SharedTaskStore implements TaskStore {
  readonly inner = new InMemoryTaskStore();
  readonly gets = new Map<string, number>();
  readonly results = new Map<string, number>();
  createTask(params: CreateTaskOptions, requestId: RequestId, request: Request): Promise<Task> {
    return this.inner.createTask(params, requestId, request);
  }
  getTask(taskId: string): Promise<Task | null> {
    this.gets.set(taskId, (this.gets.get(taskId) ?? 0) + 1);
    return this.inner.getTask(taskId);
  }
  storeTaskResult(taskId: string, status: "completed" | "failed", result: Result): Promise<void> {
    return this.inner.storeTaskResult(taskId, status, result);
  }
  getTaskResult(taskId: string): Promise<Result> {
    this.results.set(taskId, (this.results.get(taskId) ?? 0) + 1);
    return this.inner.getTaskResult(taskId);
  }
  updateTaskStatus(taskId: string, status: Task["status"], statusMessage?: string): Promise<void> {
    return this.inner.updateTaskStatus(taskId, status, statusMessage);
  }
  listTasks(cursor?: string): Promise<{ tasks: Task[]; nextCursor?: string }> {
    return this.inner.listTasks(cursor);
  }
}

/** Options of {@link taskToolsServer}. */
export interface TaskToolsOptions {
  store: TaskStore;
  /** Milliseconds a task works before its result is stored. */
  delayMs: number;
  /** The `pollInterval` the server names for its tasks, ms (default 20). */
  pollIntervalMs?: number;
  /** The tools' `execution.taskSupport` (default `required`). */
  support?: "required" | "optional";
  /** Advertise `tasks.requests.tools.call` (default true); false: a server that lists task tools but offers no tasks. */
  capability?: boolean;
}

/**
 * The example tools `calc` and `lookup` (schemas of infra/tools/tools.example.json verbatim, answers as
 * infra/tools/mcp-server.ts gives them: a trajectory through either has the same tokens) as MCP task tools, with
 * the SDK's low-level `Server` and its task handlers (`tasks/get`, `tasks/result`, `tasks/cancel` over `store`),
 * plus `boom`, a task that fails (`failed`, an `isError` result "kettle broke"), and `ask`, a task that stays
 * `input_required`. A task-augmented `tools/call` answers `CreateTaskResult` at once and stores the result after
 * `delayMs`; a plain call of an `optional` tool waits for it and answers it.
 */
export function taskToolsServer(log: TaskLog, opts: TaskToolsOptions): Server {
  const capabilities = opts.capability === false ? { tools: {} } : { tools: {}, tasks: { requests: { tools: { call: {} } }, cancel: {} } };
  const server = new Server({ name: "fixture-tasks", version: "1.0.0" }, { capabilities, taskStore: opts.store });
  const support = opts.support ?? "required";
  const extra = [
    { name: "boom", description: "A task that fails.", inputSchema: { type: "object" as const, properties: {} } },
    { name: "ask", description: "A task that asks for input.", inputSchema: { type: "object" as const, properties: {} } },
  ];
  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: [
      ...example.tools.map((t) => ({ name: t.name, description: t.schema.function.description, inputSchema: t.schema.function.parameters as unknown as { type: "object" }, execution: { taskSupport: support } })),
      ...extra.map((t) => ({ ...t, execution: { taskSupport: support } })),
    ],
  }));
  const answer = (name: string, args: Record<string, unknown>): CallToolResult => {
    if (name === "calc") return { content: [{ type: "text", text: calcToolContent(args) }] };
    if (name === "lookup") return { content: [{ type: "text", text: lookupFact(String(args.query ?? ""), DEFAULT_FACTS) }] };
    return { content: [{ type: "text", text: "kettle broke" }], isError: true };
  };
  server.setRequestHandler(CallToolRequestSchema, async (req, ex) => {
    const callId = String(req.params._meta?.["edgeloop/call_id"]);
    log.executions.set(callId, (log.executions.get(callId) ?? 0) + 1);
    const name = req.params.name;
    const args = req.params.arguments ?? {};
    const task = await opts.store.createTask({ ttl: req.params.task?.ttl ?? null, pollInterval: opts.pollIntervalMs ?? 20 }, ex.requestId, { method: req.method, params: req.params });
    log.tasks.push({ call_id: callId, task_id: task.taskId, augmented: req.params.task !== undefined });
    const done = new Promise<void>((resolve) =>
      setTimeout(() => {
        const settle =
          name === "ask"
            ? opts.store.updateTaskStatus(task.taskId, "input_required")
            : opts.store.storeTaskResult(task.taskId, name === "boom" ? "failed" : "completed", answer(name, args));
        // A task cancelled (or expired) meanwhile keeps its status.
        void settle.catch(() => undefined).then(resolve);
      }, opts.delayMs),
    );
    if (req.params.task) return { task };
    await done;
    return (await opts.store.getTaskResult(task.taskId)) as CallToolResult;
  });
  return server;
}
