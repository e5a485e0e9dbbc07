import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { CompositeToolExecutor } from "../../shared/tools/composite-tool-executor.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { fixtureServer } from "./fixture-server.ts";

const req = (name: string, args: unknown = {}) => ({ name, arguments: args, key: "k", turn: 1, index: 0 });

describe("CompositeToolExecutor: webhook tools and MCP tools as one", () => {
  let tools: ToolServer;
  let http: McpHttpServer;
  let webhook: WebhookToolClient;
  let mcp: McpToolClient;
  beforeAll(async () => {
    tools = startToolServer();
    http = serveMcpHttp(() => fixtureServer({ calls: [] }, () => undefined));
    const file = parseToolsFile(await Bun.file(new URL("../../infra/tools/tools.example.json", import.meta.url)).text(), { vars: { port: tools.port } });
    webhook = new WebhookToolClient(file.tools);
    mcp = await McpToolClient.connect([McpServerSpec.parse({ name: "fx", url: http.url, tools: ["echo", "fail"] })]);
  });
  afterAll(async () => {
    await mcp.close();
    await http.stop();
    await tools.stop();
  });
  const sources = () => [
    { executor: webhook, ownerOf: (n: string) => `webhook tool tools[${webhook.names.indexOf(n)}]` },
    { executor: mcp, ownerOf: (n: string) => `MCP server '${mcp.serverOf(n)}'` },
  ];

  test("schemas in order (webhook tools first), calls routed by name", async () => {
    const all = new CompositeToolExecutor(sources());
    expect(all.names).toEqual(["calc", "lookup", "echo", "fail"]);
    expect(all.schemas.map((s) => s.function.name)).toEqual(["calc", "lookup", "echo", "fail"]);
    expect((await all.call(req("calc", { expression: "6*7" }))).content).toBe("42");
    expect((await all.call(req("echo", { text: "mcp" }))).content).toBe("mcp");
    expect((await all.call(req("nope"))).content).toBe("Unknown function 'nope'. Available tools: ['calc', 'lookup', 'echo', 'fail']");
  });

  test("select restricts every source", async () => {
    const some = new CompositeToolExecutor(sources()).select(["lookup", "echo"]);
    expect(some.names).toEqual(["lookup", "echo"]);
    expect((await some.call(req("calc", { expression: "1" }))).content).toBe("Unknown function 'calc'. Available tools: ['lookup', 'echo']");
  });

  test("a name offered by a webhook tool and an MCP server is a ConfigError naming both", async () => {
    const example = serveMcpHttp(() => createMcpToolsServer());
    const clash = await McpToolClient.connect([McpServerSpec.parse({ name: "math", url: example.url, tools: ["lookup"] })]);
    let e: unknown;
    try {
      new CompositeToolExecutor([sources()[0]!, { executor: clash, ownerOf: (n) => `MCP server '${clash.serverOf(n)}'` }]);
    } catch (err) {
      e = err;
    }
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as Error).message).toBe("config tools: tool 'lookup' is offered by webhook tool tools[1] and by MCP server 'math'; tool names must be unique across webhook tools and MCP servers");
    await clash.close();
    await example.stop();
  });
});
