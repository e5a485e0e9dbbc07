import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { signatureHeader, SIGNATURE_HEADER } from "../../shared/tools/signature.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { evaluateExpression } from "../../infra/tools/calc.ts";
import { lookupFact } from "../../infra/tools/lookup.ts";

const SECRET = "tool-secret";
let srv: ToolServer;
let open: ToolServer;

beforeAll(() => {
  srv = startToolServer({ secret: SECRET });
  open = startToolServer({});
});
afterAll(async () => {
  await srv.stop();
  await open.stop();
});

async function post(server: ToolServer, tool: string, body: unknown, sig?: string | null) {
  const raw = JSON.stringify(body);
  const headers: Record<string, string> = { "content-type": "application/json" };
  const s = sig === undefined ? await signatureHeader(SECRET, raw, Date.now() / 1000) : sig;
  if (s) headers[SIGNATURE_HEADER] = s;
  const res = await fetch(`${server.url}/tools/${tool}`, { method: "POST", headers, body: raw });
  return { status: res.status, body: await res.json() };
}

const call = (call_id: string, name: string, args: Record<string, unknown>) => ({ call_id, name, arguments: args, key: "u_0_0", turn: 1, create_kwargs: {} });

describe("example tool server over loopback", () => {
  test("calc with a good signature", async () => {
    expect(await post(srv, "calc", call("a:1:0", "calc", { expression: "(3 + 4) * 2 / sqrt(16)" }))).toEqual({ status: 200, body: { content: "3.5" } });
  });

  test("401 on a bad, missing or stale signature", async () => {
    const bad = { error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } };
    expect(await post(srv, "calc", call("b:1:0", "calc", { expression: "1" }), "t=1,v1=abc")).toEqual({ status: 401, body: bad });
    expect(await post(srv, "calc", call("b:1:0", "calc", { expression: "1" }), null)).toEqual({ status: 401, body: bad });
    const raw = JSON.stringify(call("b:1:0", "calc", { expression: "1" }));
    const stale = await signatureHeader(SECRET, raw, Date.now() / 1000 - 301);
    expect(await post(srv, "calc", call("b:1:0", "calc", { expression: "1" }), stale)).toEqual({ status: 401, body: bad });
  });

  test("same call_id → same answer, executed once; a different call under the same id → 409", async () => {
    const before = (await (await fetch(`${srv.url}/stats`)).json()) as { executions: number };
    const a = await post(srv, "lookup", call("dup:1:0", "lookup", { query: "speed of light" }));
    const b = await post(srv, "lookup", call("dup:1:0", "lookup", { query: "speed of light" }));
    expect(a).toEqual({ status: 200, body: { content: "The speed of light in vacuum is 299792458 m/s." } });
    expect(b).toEqual(a);
    const after = (await (await fetch(`${srv.url}/stats`)).json()) as { executions: number };
    expect(after.executions - before.executions).toBe(1);
    expect(await post(srv, "lookup", call("dup:1:0", "lookup", { query: "pi" }))).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "call_id 'dup:1:0' was already used for a different call" } },
    });
  });

  test("errors as content; unknown tool 404; bad body 400", async () => {
    expect((await post(open, "calc", call("c:1:0", "calc", { expression: "x = 3" }), null)).body).toEqual({ content: "Error: assignments are not allowed" });
    expect((await post(open, "calc", call("c:1:1", "calc", { expression: "f(x) = x^2" }), null)).body).toEqual({ content: "Error: function definitions are not allowed" });
    expect((await post(open, "calc", call("c:1:2", "calc", { expression: 'import({"a": 1}, {})' }), null)).body).toEqual({ content: "Error: function 'import' is not allowed" });
    expect((await post(open, "calc", call("c:1:3", "calc", {}), null)).body).toEqual({ content: "Error: calc needs a string argument 'expression'." });
    expect(await post(open, "weather", call("c:1:4", "weather", {}), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "unknown tool 'weather'; tools: calc, lookup" } },
    });
    // Names of Object.prototype's own properties are no tools.
    expect(await post(open, "constructor", call("c:1:5", "constructor", {}), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "unknown tool 'constructor'; tools: calc, lookup" } },
    });
    expect(await post(open, "calc", { name: "calc" }, null)).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "body.call_id: Invalid input: expected string, received undefined (and 3 more issues)", field: "body.call_id" } },
    });
  });

  test("the example tools file + WebhookToolClient against the server", async () => {
    const text = await Bun.file(new URL("../../infra/tools/tools.example.json", import.meta.url)).text();
    const f = parseToolsFile(text, { vars: { port: srv.port } });
    const client = new WebhookToolClient(f.tools, { secret: SECRET });
    expect(await client.call({ name: "calc", arguments: { expression: "2^10" }, key: "k_0_0", turn: 1, index: 0 })).toEqual({
      ok: true,
      call_id: "k_0_0:1:0",
      attempts: 1,
      content: "1024",
    });
    expect((await client.call({ name: "lookup", arguments: { query: "What is the population of Paris?" }, key: "k_0_0", turn: 1, index: 1 })).content).toBe(
      "Paris (the city proper) has about 2.1 million inhabitants.",
    );
    const wrong = new WebhookToolClient(f.tools, { secret: "nope" });
    expect((await wrong.call({ name: "calc", arguments: { expression: "1" }, key: "k_0_0", turn: 1, index: 2 })).content).toBe("Error executing tool 'calc': HTTP 401");
  });
});

describe("calc and lookup", () => {
  test("calc values", () => {
    expect(evaluateExpression("0.1 + 0.2")).toBe("0.3");
    expect(evaluateExpression("5!")).toBe("120");
    expect(evaluateExpression("10 % 3")).toBe("1");
    expect(evaluateExpression("-2^2")).toBe("-4");
    expect(evaluateExpression("1/3")).toBe("0.33333333333333");
    expect(() => evaluateExpression("1; 2")).toThrow("several statements are not allowed");
    expect(() => evaluateExpression("a.b")).toThrow("property accesses are not allowed");
    expect(() => evaluateExpression("2 cm")).toThrow("unknown symbol 'cm' (variables, units and assignments are not allowed)");
    expect(() => evaluateExpression('"s"')).toThrow("only numbers are allowed as constants");
    expect(() => evaluateExpression("1".repeat(501))).toThrow("expression is longer than 500 characters");
  });
  test("lookup: exact, contained, unknown", () => {
    expect(lookupFact("MILE TO KM")).toBe("1 mile = 1.609344 km.");
    expect(lookupFact("how many people live in tokyo")).toBe("Tokyo (the metropolis) has about 14 million inhabitants.");
    expect(lookupFact("g")).toBe("Standard gravitational acceleration is 9.80665 m/s^2.");
    expect(lookupFact("dark matter").startsWith("No fact found for 'dark matter'. Known topics: speed of light, gravitational acceleration,")).toBe(true);
  });
});
