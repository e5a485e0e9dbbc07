import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { SharedTaskStore, taskToolsServer, type TaskLog } from "./fixture-server.ts";

// MCP tasks (protocol 2025-11-25): task-augmented tools/call, tasks/get polls, tasks/result.
const req = (name: string, args: unknown = {}, index = 0) => ({ name, arguments: args, key: "k", turn: 1, index });
const spec = (s: Record<string, unknown>) => McpServerSpec.parse(s);
const FAST = { retryMinTimeoutMs: 1, retryMaxTimeoutMs: 1 };
const newLog = (): TaskLog => ({ executions: new Map(), tasks: [] });

describe("MCP tools run as tasks", () => {
  const log = newLog();
  const store = new SharedTaskStore();
  let http: McpHttpServer;
  let plainHttp: McpHttpServer;
  let client: McpToolClient;
  beforeAll(async () => {
    http = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 80 }));
    plainHttp = serveMcpHttp(() => createMcpToolsServer());
    client = await McpToolClient.connect([spec({ name: "tasks", url: http.url, timeout_ms: 2000 })], FAST);
  });
  afterAll(async () => {
    await client.close();
    await http.stop();
    await plainHttp.stop();
  });

  test("a required-task tool is called as a task, polled, and its result mapped as a plain call's", async () => {
    const before = log.tasks.length;
    const r = await client.call(req("calc", { expression: "12*3-5" }, 1));
    expect(r).toEqual({ ok: true, call_id: "k:1:1", attempts: 1, content: "31" });
    const made = log.tasks.slice(before);
    expect(made.map((t) => [t.call_id, t.augmented])).toEqual([["k:1:1", true]]);
    expect(log.executions.get("k:1:1")).toBe(1);
    // Polled while working (80 ms at 20 ms intervals), then one tasks/result (whose handler reads the task, then its result).
    expect(store.gets.get(made[0]!.task_id)!).toBeGreaterThanOrEqual(3);
    expect(store.results.get(made[0]!.task_id)).toBe(1);
    // The same text as the example server's plain call.
    const plain = await McpToolClient.connect([spec({ name: "plain", url: plainHttp.url })]);
    expect((await plain.call(req("calc", { expression: "12*3-5" }, 1))).content).toBe(r.content);
    expect((await plain.call(req("lookup", { query: "capital of France" }))).content).toBe((await client.call(req("lookup", { query: "capital of France" }))).content);
    await plain.close();
  });

  test("with deferTasks the call stops at the created task; another client (a resumed process) polls the same id", async () => {
    const before = log.tasks.length;
    const r = await client.call({ ...req("lookup", { query: "capital of France" }, 0), key: "d", deferTasks: true });
    const made = log.tasks.slice(before);
    expect(made.length).toBe(1);
    expect(r).toEqual({
      ok: false,
      pending: true,
      call_id: "d:1:0",
      attempts: 1,
      task_id: made[0]!.task_id,
      timeout_ms: 3_600_000,
      content: `Error executing tool 'lookup': it runs as MCP task '${made[0]!.task_id}', whose result this loop cannot wait for`,
    });
    const other = await McpToolClient.connect([spec({ name: "tasks", url: http.url, timeout_ms: 2000 })], FAST);
    const got = await other.awaitTask({ name: "lookup", call_id: "d:1:0", task_id: r.task_id!, within_ms: 5000, timeout_ms: 5000 });
    await other.close();
    const plain = await McpToolClient.connect([spec({ name: "plain", url: plainHttp.url })]);
    expect(got).toEqual({ ok: true, call_id: "d:1:0", attempts: 1, content: (await plain.call(req("lookup", { query: "capital of France" }))).content });
    await plain.close();
    expect(log.executions.get("d:1:0")).toBe(1);
    expect(log.tasks.length).toBe(before + 1);
  });

  test("an unknown (or expired) task id is an error observation naming the task; nothing is sent again", async () => {
    const before = log.tasks.length;
    expect(await client.awaitTask({ name: "calc", call_id: "k:9:0", task_id: "no-such-task", within_ms: 5000, timeout_ms: 5000 })).toEqual({
      ok: false,
      call_id: "k:9:0",
      attempts: 1,
      content: "Error executing tool 'calc': MCP server 'tasks' does not know MCP task 'no-such-task' (unknown or expired: Failed to retrieve task: Task not found)",
    });
    expect(log.tasks.length).toBe(before);
  });

  test("a failed task is its error result; input_required is cancelled; past task_timeout_ms the task is cancelled", async () => {
    expect(await client.call(req("boom"))).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'boom': kettle broke" });
    const ask = await client.call({ ...req("ask"), key: "ask" });
    const askTask = log.tasks.find((t) => t.call_id === "ask:1:0")!.task_id;
    expect(ask).toEqual({ ok: false, call_id: "ask:1:0", attempts: 1, content: `Error executing tool 'ask': MCP task '${askTask}' asks for input (input_required), which edgeloop cannot give; it was cancelled` });
    expect((await store.inner.getTask(askTask))?.status).toBe("cancelled");
    const short = await McpToolClient.connect([spec({ name: "tasks", url: http.url, timeout_ms: 2000, task_timeout_ms: 30 })], FAST);
    const late = await short.call({ ...req("calc", { expression: "1+1" }), key: "late" });
    await short.close();
    const lateTask = log.tasks.find((t) => t.call_id === "late:1:0")!.task_id;
    expect(late).toEqual({ ok: false, call_id: "late:1:0", attempts: 1, content: `Error executing tool 'calc': no task result within 30 ms (MCP task '${lateTask}')` });
    expect((await store.inner.getTask(lateTask))?.status).toBe("cancelled");
  });
});

describe("when tools/call runs as a task", () => {
  const log = newLog();
  const store = new SharedTaskStore();
  let optional: McpHttpServer;
  let noTasks: McpHttpServer;
  beforeAll(() => {
    optional = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 10, support: "optional" }));
    noTasks = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 10, support: "optional", capability: false }));
  });
  afterAll(async () => {
    await optional.stop();
    await noTasks.stop();
  });
  const augmented = async (url: string, extra: Record<string, unknown>, key: string): Promise<boolean | undefined> => {
    const c = await McpToolClient.connect([spec({ name: "s", url, ...extra })], FAST);
    expect(await c.call({ ...req("calc", { expression: "2+2" }), key })).toEqual({ ok: true, call_id: `${key}:1:0`, attempts: 1, content: "4" });
    await c.close();
    return log.tasks.find((t) => t.call_id === `${key}:1:0`)?.augmented;
  };

  test("an optional tool: a task with tasks: always; a plain call by default and with never; a server without the capability: plain, as today", async () => {
    expect(await augmented(optional.url, { tasks: "always" }, "always")).toBe(true);
    expect(await augmented(optional.url, {}, "auto")).toBe(false);
    expect(await augmented(optional.url, { tasks: "never" }, "never")).toBe(false);
    expect(await augmented(noTasks.url, { tasks: "always" }, "nocap")).toBe(false);
  });

  test("a required tool without the server's capability, or with tasks: never, is refused at start naming the field", async () => {
    const required = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 10, capability: false }));
    const withCap = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 10 }));
    try {
      const e1 = await McpToolClient.connect([spec({ name: "s", url: required.url })]).then(() => null, (e) => e);
      expect(e1).toBeInstanceOf(ConfigError);
      expect((e1 as ConfigError).message).toContain("mcp_servers[0]: MCP server 's': tool 'calc' requires running as a task (execution.taskSupport 'required') but the server does not offer tasks for tools/call");
      const e2 = await McpToolClient.connect([spec({ name: "s", url: withCap.url, tasks: "never" })]).then(() => null, (e) => e);
      expect((e2 as ConfigError).message).toContain("mcp_servers[0].tasks: MCP server 's': tool 'calc' requires running as a task");
      expect(spec({ name: "s", url: withCap.url }).tasks).toBeUndefined();
      expect(McpServerSpec.safeParse({ name: "s", url: withCap.url, tasks: "sometimes" }).error?.issues.map((i) => [i.path.join("."), i.message])).toEqual([
        ["tasks", "must be one of auto (tasks for tools that require them), always (also for tools that allow them) or never"],
      ]);
    } finally {
      await required.stop();
      await withCap.stop();
    }
  });
});
