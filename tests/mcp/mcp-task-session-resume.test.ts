import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { McpServerSpec } from "../../shared/schema/index.ts";
import type { SessionCheckpoint } from "../../shared/session/checkpoint.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { DyingStorage } from "../helpers/dying-storage.ts";
import { comparable, depsFor, inputFor, sessionLoopFactory } from "../session/fixtures.ts";
import { SharedTaskStore, taskToolsServer, type TaskLog } from "./fixture-server.ts";

// Durable sessions whose MCP calls run as tasks: the task id is checkpointed before the wait; a session resumed
// (on another process: another MCP client and session) polls that task id and never sends the call again.
const log: TaskLog = { executions: new Map(), tasks: [] };
const store = new SharedTaskStore();
let taskHttp: McpHttpServer;
let plainHttp: McpHttpServer;
// The example's two tools only (the fixture's `boom` and `ask` would change the prompt).
const spec = (url: string) => McpServerSpec.parse({ name: "tasks", url, timeout_ms: 5000, tools: ["calc", "lookup"] });
beforeAll(() => {
  taskHttp = serveMcpHttp(() => taskToolsServer(log, { store, delayMs: 60 }));
  plainHttp = serveMcpHttp(() => createMcpToolsServer());
});
afterAll(async () => {
  await taskHttp.stop();
  await plainHttp.stop();
});

type Loop = { assistant_turns: number; pending: { index: number }[]; tool_results: ({ awaiting?: true; call_id: string; task_id?: string } | null)[] | null };

describe("durable sessions with MCP task tools", () => {
  let deps: Awaited<ReturnType<typeof depsFor>>["deps"];
  let reference: AgentLoopOutput;
  const run = async (sd: SessionDeps, input: ReturnType<typeof inputFor>): Promise<AgentLoopOutput> => {
    const r = await (await TrajectorySession.open(input.key, sd, input))!.run();
    if (r.status !== "finished") throw new Error(`unexpected ${JSON.stringify(r)}`);
    return r.outputs[0]!;
  };
  beforeAll(async () => {
    deps = (await depsFor("http://127.0.0.1:1")).deps;
    const plain = await McpToolClient.connect([McpServerSpec.parse({ name: "tasks", url: plainHttp.url })]);
    // Row 3: lookup, then calc; the same tools answered as plain calls.
    reference = await run({ storage: new MemorySessionStorage(), createLoop: sessionLoopFactory({ ...deps, tools: plain }) }, inputFor(3, 1, undefined, "ref"));
    await plain.close();
  });

  test("a trajectory through task tools has the tokens of the same tools called plainly; each call executes once", async () => {
    const mcp = await McpToolClient.connect([spec(taskHttp.url)]);
    const mem = new MemorySessionStorage();
    const states: string[] = [];
    const out = await run({ storage: mem, createLoop: sessionLoopFactory({ ...deps, tools: mcp }), onCommit: (cp) => void states.push(`${cp.phase}/${cp.loop_state}`) }, inputFor(3, 1, undefined, "t"));
    await mcp.close();
    expect(comparable(out)).toEqual(comparable(reference));
    expect([...log.executions].filter(([id]) => id.startsWith("t_1_0:"))).toEqual([
      ["t_1_0:1:0", 1],
      ["t_1_0:2:0", 1],
    ]);
    // Each tool round: issued, the task ids committed (running on: the session polls, it does not wait for a callback), answered.
    expect(states).toEqual([
      "running/generating",
      "running/processing_tools",
      "running/awaiting_tools",
      "running/generating",
      "running/processing_tools",
      "running/awaiting_tools",
      "running/generating",
      "running/terminated",
      "finished/terminated",
    ]);
  });

  test("a kill before each commit resumes (another client) to the identical trajectory; a checkpointed task is polled, never re-sent", async () => {
    let points = 0;
    let polledAfterResume = 0;
    for (let killAt = 1; ; killAt++) {
      const input = inputFor(3, 1, undefined, `k${killAt}`);
      const mem = new MemorySessionStorage();
      let committed: SessionCheckpoint | undefined;
      const mcp1 = await McpToolClient.connect([spec(taskHttp.url)]);
      const s1 = (await TrajectorySession.open(input.key, { storage: new DyingStorage(mem, killAt), createLoop: sessionLoopFactory({ ...deps, tools: mcp1 }), onCommit: (cp) => void (committed = structuredClone(cp)) }, input))!;
      const killed = await s1.run().then(
        () => false,
        (e) => (e as Error).message === "killed",
      );
      await mcp1.close();
      if (!killed) break;
      const loop = committed?.loop as Loop | null | undefined;
      const checkpointed = committed?.loop_state === "awaiting_tools" ? (loop?.tool_results ?? []).filter((r) => r?.awaiting && r.task_id !== undefined) : [];
      const pollsBefore = new Map(checkpointed.map((r) => [r!.task_id!, store.gets.get(r!.task_id!) ?? 0]));
      const mcp2 = await McpToolClient.connect([spec(taskHttp.url)]);
      const r = await (await TrajectorySession.open(input.key, { storage: mem, createLoop: sessionLoopFactory({ ...deps, tools: mcp2 }) }, input))!.run();
      await mcp2.close();
      expect(r.status).toBe("finished");
      expect(comparable((r as { outputs: AgentLoopOutput[] }).outputs[0]!)).toEqual(comparable(reference));
      // Each call executes once, except one the last commit left issued without its task id (processing_tools): sent again, same call id.
      const inFlight = committed?.loop_state === "processing_tools" ? (loop?.pending ?? []).map((p) => `${input.key}:${loop!.assistant_turns}:${p.index}`) : [];
      const mine = [...log.executions].filter(([id]) => id.startsWith(`${input.key}:`));
      expect(mine.sort()).toEqual([`${input.key}:1:0`, `${input.key}:2:0`].map((id) => [id, inFlight.includes(id) ? 2 : 1] as [string, number]));
      // Results read: one per call whose answer was committed; a result read again only when the kill hit the commit of
      // its answer (the last landed commit held just its task id); a task created but not committed is never read.
      const reads = log.tasks.filter((t) => t.call_id.startsWith(`${input.key}:`)).map((t) => store.results.get(t.task_id) ?? 0);
      expect(reads.reduce((a, b) => a + b, 0)).toBe(2 + checkpointed.length);
      expect(Math.max(...reads)).toBe(checkpointed.length > 0 ? 2 : 1);
      for (const c of checkpointed) {
        // The resumed session polled the checkpointed task id, and that call's only execution made it.
        expect(store.gets.get(c!.task_id!)!).toBeGreaterThan(pollsBefore.get(c!.task_id!)!);
        expect(log.tasks.filter((t) => t.call_id === c!.call_id)).toEqual([{ call_id: c!.call_id, task_id: c!.task_id!, augmented: true }]);
        polledAfterResume++;
      }
      points++;
    }
    expect(points).toBe(9);
    // The kills right after each round's task ids were committed: two (lookup, then calc).
    expect(polledAfterResume).toBe(2);
  });

  test("a checkpointed task the server no longer knows is an error observation (as an expired callback is); the call is not sent again", async () => {
    const input = inputFor(3, 1, undefined, "gone");
    const mem = new MemorySessionStorage();
    let committed: SessionCheckpoint | undefined;
    const mcp1 = await McpToolClient.connect([spec(taskHttp.url)]);
    // The third commit is the first round's task id; the fourth (its answer) dies.
    const s1 = (await TrajectorySession.open(input.key, { storage: new DyingStorage(mem, 4), createLoop: sessionLoopFactory({ ...deps, tools: mcp1 }), onCommit: (cp) => void (committed = structuredClone(cp)) }, input))!;
    await expect(s1.run()).rejects.toThrow("killed");
    await mcp1.close();
    expect(committed?.loop_state).toBe("awaiting_tools");
    const taskId = (committed!.loop as Loop).tool_results![0]!.task_id!;
    expect(log.tasks.filter((t) => t.call_id === "gone_1_0:1:0")).toEqual([{ call_id: "gone_1_0:1:0", task_id: taskId, augmented: true }]);
    // A callback cannot answer a task call: its result comes from the server.
    const opened = (await TrajectorySession.open(input.key, { storage: mem, createLoop: sessionLoopFactory({ ...deps, tools: mcp1 }) }))!;
    await expect(opened.deliverToolResult({ call_id: "gone_1_0:1:0", content: "forged" })).rejects.toThrow("tool call 'gone_1_0:1:0' runs as an MCP task: its result is read from the MCP server, not delivered");
    // The server forgets its tasks (restarted with a memory store, or the ttl passed).
    store.inner.cleanup();
    const mcp2 = await McpToolClient.connect([spec(taskHttp.url)]);
    const out = await run({ storage: mem, createLoop: sessionLoopFactory({ ...deps, tools: mcp2 }) }, input);
    await mcp2.close();
    expect(out.extra_fields.tool_errors).toBe(1);
    const { tok } = await depsFor("http://127.0.0.1:1");
    expect(tok.decode(out.response_ids)).toContain(`Error executing tool 'lookup': MCP server 'tasks' does not know MCP task '${taskId}' (unknown or expired: Failed to retrieve task: Task not found)`);
    expect(log.executions.get("gone_1_0:1:0")).toBe(1);
  });
});
