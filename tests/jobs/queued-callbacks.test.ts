import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { buildRuntime, hasSignedCalls, unsignedToolsWarning, type Runtime } from "../../infra/cli/runtime.ts";
import { createMcpToolsServer, serveMcpHttp } from "../../infra/tools/mcp-server.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { ROOT, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Queue mode with an asynchronous tool (202, result by callback): `serve` only commits the
// callback's result and wakes the worker that runs the session; the worker continues it at once,
// not at the tool's 60 s deadline. `serve`'s engine answers nothing: it must never be called.
const redis = await requireRedis();
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const SECRET = "queued-callbacks-secret";
const CALLBACK_DELAY_MS = 300;

describe.skipIf(!redis)("queue mode: asynchronous tool results", () => {
  const prefix = randomPrefix("queued-cb");
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-queued-cb-"));
  let deadEngine: ReturnType<typeof Bun.serve>;
  let engineCalls = 0;
  let tool: ReturnType<typeof Bun.serve>;
  let apiServer: ReturnType<typeof Bun.serve> | undefined;
  const callbacks: { call_id: string; status: number; at: number }[] = [];
  const toolCalls: string[] = [];
  let api: Runtime | undefined;
  let worker: Bun.Subprocess<"ignore", "pipe", "pipe"> | undefined;
  let toolsFile: string;

  beforeAll(() => {
    // serve's "engine": counts generate requests and answers none of them usefully.
    deadEngine = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch(req) {
        if (req.method === "POST") engineCalls++;
        return new Response("no", { status: 503 });
      },
    });
    // The tool accepts every call with 202 and posts the signed result to serve a moment later.
    tool = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      async fetch(req) {
        const call = (await req.json()) as { call_id: string; key: string };
        toolCalls.push(call.call_id);
        setTimeout(async () => {
          const raw = JSON.stringify({ call_id: call.call_id, content: "31" });
          const res = await fetch(`http://127.0.0.1:${apiServer!.port}/v1/sessions/${call.key}/tool-results`, {
            method: "POST",
            headers: { "content-type": "application/json", "x-edgeloop-signature": await signatureHeader(SECRET, raw, Date.now() / 1000) },
            body: raw,
          });
          await res.body?.cancel();
          callbacks.push({ call_id: call.call_id, status: res.status, at: Date.now() });
        }, CALLBACK_DELAY_MS);
        return new Response(null, { status: 202 });
      },
    });
    const schema = { type: "function", function: { name: "calc", description: "calc", parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] } } };
    toolsFile = join(dir, "tools.json");
    writeFileSync(toolsFile, JSON.stringify({ tools: [{ name: "calc", url: `http://127.0.0.1:${tool.port}/calc`, timeout_ms: 60_000, max_retries: 0, schema }] }));
  });
  afterAll(async () => {
    worker?.kill("SIGKILL");
    apiServer?.stop(true);
    await api?.close();
    deadEngine.stop(true);
    tool.stop(true);
    await deleteByPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  test("the callback's result is committed by serve and continued by the waiting worker at once: one record, no engine call from serve, job acked", async () => {
    api = await buildRuntime(
      { engine: `http://127.0.0.1:${deadEngine.port}`, tools: toolsFile, toolsSecret: SECRET, store: REDIS_URL, storePrefix: prefix, n: 1, seed: 7, maxModelLen: 4096 },
      { jobs: "queue" },
    );
    const app = createRolloutsApp({ service: api.service });
    apiServer = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createSessionsApp({ backend: api.callbacks!, secret: SECRET }).fetch });

    const w = Bun.spawn(
      [process.execPath, MAIN, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--engine", "sim", "--tools", toolsFile, "--tools-secret", SECRET, "--max-model-len", "4096", "--seed", "7", "--idle-exit", "2", "--consumer", "waiter"],
      { stdin: "ignore", stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } },
    );
    worker = w;
    const row = { ...ROWS[0], uid: "async0" };
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [row] }) });
    expect(res.status).toBe(202);
    const { keys } = (await res.json()) as { keys: string[] };
    expect(keys).toEqual(["async0_0_0"]);

    // Far below the tool's 60 s timeout: the record must come from the callback, not the deadline.
    const end = Date.now() + 20_000;
    let stored = await api.store.get("async0_0_0");
    while (!stored && Date.now() < end) {
      await Bun.sleep(20);
      stored = await api.store.get("async0_0_0");
    }
    const storedAt = Date.now();
    expect(stored).not.toBeNull();
    expect(stored!.error).toBeNull();
    expect(stored!.extra_fields.tool_calls).toBe(1);
    expect(stored!.extra_fields.tool_errors).toBe(0);
    expect(toolCalls).toEqual(["async0_0_0:1:0"]);
    expect(callbacks.map((c) => [c.call_id, c.status])).toEqual([["async0_0_0:1:0", 200]]);
    const lag = storedAt - callbacks[0]!.at;
    console.log(`queued callback: record stored ${lag} ms after the callback was answered (tool timeout 60 000 ms)`);
    expect(lag).toBeLessThan(15_000);

    // serve never continued the session (its engine saw no generate request); one record, the job acked.
    expect(engineCalls).toBe(0);
    expect(await api.store.groupStatus("async0")).toMatchObject({ expected: 1, finished: 1, records: 1, failed: 0, complete: true });
    const code = await w.exited;
    const out = await new Response(w.stdout).text();
    if (code !== 0) throw new Error(`worker exited ${code}: ${await new Response(w.stderr).text()}`);
    expect(JSON.parse(out.trim().split("\n").pop()!)).toMatchObject({ consumer: "waiter", claimed: 1, completed: 1, failed: 0, abandoned: 0, exit: "idle" });
    expect(await api.jobs!.stats()).toMatchObject({ depth: 0, in_flight: 0 });
    expect(await api.sessions!.status("async0_0_0")).toMatchObject({ phase: "done", loop_state: "terminated" });
    // A late duplicate of the callback changes nothing.
    const raw = JSON.stringify({ call_id: "async0_0_0:1:0", content: "31" });
    const again = await fetch(`http://127.0.0.1:${apiServer!.port}/v1/sessions/async0_0_0/tool-results`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-edgeloop-signature": await signatureHeader(SECRET, raw, Date.now() / 1000) },
      body: raw,
    });
    expect(again.status).toBe(409);
    expect(engineCalls).toBe(0);
  }, HANG_MS);

  test("serve and worker warn at start when a tools file has no tools.secret", () => {
    const signed = hasSignedCalls(parseToolsFile(readFileSync(toolsFile, "utf8")));
    expect(signed).toBe(true);
    expect(unsignedToolsWarning(parseAppConfig({ tools: { file: toolsFile } }), signed)).toBe(
      "warning    tools are configured without tools.secret: tool calls are unsigned and tool-result callbacks (POST /v1/sessions/{key}/tool-results) are refused with 403; set --tools-secret (the tool servers must sign with it)",
    );
    expect(unsignedToolsWarning(parseAppConfig({ tools: { file: toolsFile, secret: SECRET } }), signed)).toBeNull();
    expect(unsignedToolsWarning(parseAppConfig({}), false)).toBeNull();
  });

  test("no unsigned-tools warning for a tools file of MCP servers only (MCP requests are never signed); simulated users alone are signed", async () => {
    expect(hasSignedCalls(parseToolsFile("mcp_servers: [{name: m, url: 'http://127.0.0.1:1/mcp'}]"))).toBe(false);
    expect(hasSignedCalls(parseToolsFile("interactions: [{name: u, url: 'http://127.0.0.1:1/u'}]"))).toBe(true);
    const mcp = serveMcpHttp(() => createMcpToolsServer());
    const mcpOnly = join(dir, "mcp-only.json");
    writeFileSync(mcpOnly, JSON.stringify({ mcp_servers: [{ name: "ex", url: mcp.url }] }));
    const rt = await buildRuntime({ engine: "sim", tools: mcpOnly, maxModelLen: 4096 });
    try {
      expect(rt.signedToolCalls).toBe(false);
      expect(unsignedToolsWarning(rt.config, rt.signedToolCalls)).toBeNull();
    } finally {
      await rt.close();
      await mcp.stop();
    }
  }, HANG_MS);
});
