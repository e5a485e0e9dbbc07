import { parseArgs } from "node:util";
import { startToolServer } from "./server.ts";

/**
 * `edgeloop tools --port P [--secret S]` (also `bun infra/tools/main.ts …`):
 * runs the example tool server until SIGINT/SIGTERM. The secret may also come
 * from `EDGELOOP_TOOLS_SECRET`.
 */
export async function runToolsCommand(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: { port: { type: "string", default: "8123" }, host: { type: "string", default: "127.0.0.1" }, secret: { type: "string" } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port must be an integer 0..65535, got '${values.port}'`);
  const server = startToolServer({ port, hostname: values.host, secret: values.secret ?? process.env.EDGELOOP_TOOLS_SECRET });
  console.log(`edgeloop tools listening on ${server.url} (POST /tools/calc, /tools/lookup)${values.secret ? ", signatures required" : ""}`);
  await new Promise<void>((resolve) => {
    const stop = () => void server.stop().then(resolve);
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}

if (import.meta.main) await runToolsCommand(process.argv.slice(2));
