// Run by tests/mcp/mcp-deno.test.ts under Deno: McpToolClient over Streamable HTTP (argv[0], a URL) and
// over stdio (argv[1], the command; the rest its args); prints one JSON line of the two results.
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { stdioMcpTransport } from "../../infra/tools/mcp-stdio.ts";

declare const Deno: { args: string[] };
const [url, command, ...args] = Deno.args;
const call = { name: "calc", arguments: { expression: "12*3-5" }, key: "deno", turn: 1, index: 0 };
const http = await McpToolClient.connect([McpServerSpec.parse({ name: "http", url })]);
const stdio = await McpToolClient.connect([McpServerSpec.parse({ name: "stdio", command, args })], { stdio: stdioMcpTransport });
console.log(JSON.stringify({ names: [http.names, stdio.names], http: await http.call(call), stdio: await stdio.call(call) }));
await http.close();
await stdio.close();
