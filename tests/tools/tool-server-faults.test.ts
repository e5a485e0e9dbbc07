import { afterAll, describe, expect, test } from "bun:test";
import { createToolsApp, toolTimeoutDecision, type ToolInjectedFault } from "../../infra/tools/app.ts";
import { startToolServer } from "../../infra/tools/server.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";

const call = (call_id: string, expression = "1+1") => ({ call_id, name: "calc", arguments: { expression }, key: "u_0_0", turn: 1, create_kwargs: {} });
const post = (app: ReturnType<typeof createToolsApp>, body: unknown, headers: Record<string, string> = {}) =>
  app.request("/tools/calc", { method: "POST", headers: { "content-type": "application/json", ...headers }, body: typeof body === "string" ? body : JSON.stringify(body) });

describe("tool server body limit", () => {
  const app = createToolsApp({ maxBodyBytes: 200 });
  const tooLarge = { error: { code: "request_too_large", field: "body", message: "body: larger than 200 bytes" } };

  test("a body over maxBodyBytes is 413, declared or streamed; one under it is served", async () => {
    const big = JSON.stringify(call("big", "1+".repeat(200) + "1"));
    const declared = await post(app, big, { "content-length": String(big.length) });
    expect(declared.status).toBe(413);
    expect(await declared.json()).toEqual(tooLarge);
    const streamed = await app.request("/tools/calc", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: new ReadableStream({ start: (c) => (c.enqueue(new TextEncoder().encode(big)), c.close()) }),
    });
    expect(streamed.status).toBe(413);
    expect(await streamed.json()).toEqual(tooLarge);
    const ok = await post(app, call("small"));
    expect(ok.status).toBe(200);
    expect(await ok.json()).toEqual({ content: "2" });
    expect(await (await app.request("/stats")).json()).toEqual({ executions: 1, by_tool: { calc: 1 } });
  });

  test("the default limit is 1 MiB", async () => {
    const big = "x".repeat(1024 * 1024 + 1);
    expect((await post(createToolsApp(), big)).status).toBe(413);
  });
});

describe("tool server probabilistic timeouts", () => {
  test("toolTimeoutDecision is deterministic in (seed, call_id, attempt) and hits about the rate", () => {
    let hits = 0;
    for (let i = 0; i < 10_000; i++) if (toolTimeoutDecision(0.05, 3, `k${i}_0_0:1:0`, 0)) hits++;
    expect(hits).toBeGreaterThan(400);
    expect(hits).toBeLessThan(600);
    expect(toolTimeoutDecision(0.05, 3, "a", 1)).toBe(toolTimeoutDecision(0.05, 3, "a", 1));
    expect(toolTimeoutDecision(0, 3, "a", 0)).toBe(false);
    expect(toolTimeoutDecision(1, 3, "a", 0)).toBe(true);
  });

  test("a drawn timeout is held, answered 504 unexecuted and logged; the retry draws again", async () => {
    // Find a call id whose first attempt times out and whose second does not.
    let id = "";
    for (let i = 0; !id; i++) if (toolTimeoutDecision(0.3, 9, `c${i}`, 0) && !toolTimeoutDecision(0.3, 9, `c${i}`, 1)) id = `c${i}`;
    const faults: ToolInjectedFault[] = [];
    const app = createToolsApp({ faultRate: { timeouts: 0.3, seed: 9, holdMs: 5 }, onFault: (f) => faults.push(f) });
    const first = await post(app, call(id));
    expect(first.status).toBe(504);
    expect(await first.json()).toEqual({ error: { code: "timeout", message: "simulated tool timeout" } });
    expect(await (await app.request("/stats")).json()).toEqual({ executions: 0, by_tool: {}, faults: { timeouts: 1 } });
    const second = await post(app, call(id));
    expect(second.status).toBe(200);
    expect(await second.json()).toEqual({ content: "2" });
    expect(faults).toEqual([{ kind: "timeout", call_id: id, key: "u_0_0", name: "calc", attempt: 0 }]);
    expect(await (await app.request("/stats")).json()).toEqual({ executions: 1, by_tool: { calc: 1 }, faults: { timeouts: 1 } });
  });

  describe("over loopback with the webhook client", () => {
    const faults: ToolInjectedFault[] = [];
    const srv = startToolServer({ faultRate: { timeouts: 0.5, seed: 1 }, onFault: (f) => faults.push(f) });
    afterAll(() => srv.stop());

    test("the client times out, retries with the same call_id and gets the answer, executed once", async () => {
      const text = JSON.stringify({ tools: [{ name: "calc", url: `${srv.url}/tools/calc`, timeout_ms: 150, max_retries: 6, schema: { type: "function", function: { name: "calc", parameters: { type: "object", properties: {} } } } }] });
      const client = new WebhookToolClient(parseToolsFile(text).tools, { retryMinTimeoutMs: 5, retryMaxTimeoutMs: 10 });
      // A key whose first attempt of call 0 times out (call ids are `{key}:{turn}:{index}`).
      let key = "";
      for (let i = 0; !key; i++) if (toolTimeoutDecision(0.5, 1, `t${i}_0_0:1:0`, 0)) key = `t${i}_0_0`;
      const r = await client.call({ name: "calc", arguments: { expression: "6*7" }, key, turn: 1, index: 0 });
      expect(r.content).toBe("42");
      expect(r.attempts).toBe(faults.length + 1);
      expect(faults.every((f) => f.call_id === `${key}:1:0` && f.key === key)).toBe(true);
      expect(faults.map((f) => f.attempt)).toEqual(faults.map((_, i) => i));
      expect(await (await fetch(`${srv.url}/stats`)).json()).toEqual({ executions: 1, by_tool: { calc: 1 }, faults: { timeouts: faults.length } });
    });
  });
});
