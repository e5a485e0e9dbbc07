import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { McpServerSpec } from "../../shared/schema/index.ts";
import type { SessionCheckpoint } from "../../shared/session/checkpoint.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { DyingStorage } from "../helpers/dying-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { comparable, depsFor, inputFor, sessionLoopFactory } from "../session/fixtures.ts";

// Durable sessions with MCP tools: a result committed to the checkpoint is never requested again; only a
// call in flight at the crash is sent again on resume, with the same `edgeloop/call_id` (for the server to dedupe).
let http: McpHttpServer;
let mcp: McpToolClient;
const calls: string[] = [];
beforeAll(async () => {
  http = serveMcpHttp(() => createMcpToolsServer({ onCall: (_name, meta) => void calls.push(String(meta?.["edgeloop/call_id"])) }));
  mcp = await McpToolClient.connect([McpServerSpec.parse({ name: "example", url: http.url })]);
});
afterAll(async () => {
  await mcp.close();
  await http.stop();
});


describe("durable sessions with MCP tools", () => {
  test("a kill before each commit resumes to the identical trajectory; committed results are not requested again", async () => {
    const { deps: webhookDeps } = await depsFor("http://127.0.0.1:1");
    const deps = { ...webhookDeps, tools: mcp };
    const run = async (sd: SessionDeps, input: ReturnType<typeof inputFor>): Promise<AgentLoopOutput> => {
      const r = await (await TrajectorySession.open(input.key, sd, input))!.run();
      if (r.status !== "finished") throw new Error(`unexpected ${JSON.stringify(r)}`);
      return r.outputs[0]!;
    };
    // Row 3: lookup, then calc.
    const reference = await run({ storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps) }, inputFor(3, 1, undefined, "ref"));
    expect(calls).toEqual(["ref_1_0:1:0", "ref_1_0:2:0"]);
    let points = 0;
    let resent = 0;
    for (let killAt = 1; ; killAt++) {
      const input = inputFor(3, 1, undefined, `k${killAt}`);
      const mem = new MemorySessionStorage();
      let committed: SessionCheckpoint | undefined;
      calls.length = 0;
      const s1 = (await TrajectorySession.open(input.key, { storage: new DyingStorage(mem, killAt), createLoop: sessionLoopFactory(deps), onCommit: (cp) => void (committed = structuredClone(cp)) }, input))!;
      const killed = await s1.run().then(
        () => false,
        (e) => (e as Error).message === "killed",
      );
      if (!killed) break;
      const r = await (await TrajectorySession.open(input.key, { storage: mem, createLoop: sessionLoopFactory(deps) }, input))!.run();
      expect(r.status).toBe("finished");
      expect(comparable((r as { outputs: AgentLoopOutput[] }).outputs[0]!)).toEqual(comparable({ ...reference }));
      // Each call once, except those the last commit left pending (issued, result not committed): sent again, same call id.
      const loop = committed?.loop;
      const inFlight = committed?.loop_state === "processing_tools" ? (loop?.pending ?? []).map((p) => `${input.key}:${loop!.assistant_turns}:${p.index}`) : [];
      resent += inFlight.length;
      expect([...calls].sort()).toEqual([`${input.key}:1:0`, `${input.key}:2:0`, ...inFlight].sort());
      points++;
    }
    expect(points).toBe(7);
    // The kills right after each call was issued: those calls went out twice (and only those).
    expect(resent).toBe(2);
  });
});
