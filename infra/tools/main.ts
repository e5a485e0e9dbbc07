import { parseArgs } from "node:util";
import { startToolServer } from "./server.ts";

/** Options of {@link serveTools}. */
export interface ServeToolsOptions {
  /** Port to listen on (0: a free one). */
  port: number;
  /** Address to bind. */
  host: string;
  /** HMAC secret signatures must carry; default `EDGELOOP_TOOLS_SECRET`, none when neither is set. */
  secret?: string;
}

/**
 * `edgeloop tools [--port P] [--host H] [--secret S]`: runs the example tool
 * server until SIGINT/SIGTERM. A port in use throws Bun's EADDRINUSE error
 * (the CLI prints it as one line).
 */
export async function serveTools(opts: ServeToolsOptions): Promise<void> {
  const secret = opts.secret ?? (process.env.EDGELOOP_TOOLS_SECRET || undefined);
  const server = startToolServer({ port: opts.port, hostname: opts.host, secret });
  console.log(`edgeloop tools listening on ${server.url} (POST /tools/calc, /tools/lookup; simulated user POST /interactions/gsm8k_user)${secret ? ", signatures required" : ""}`);
  await new Promise<void>((resolve) => {
    const stop = () => void server.stop().then(resolve);
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}

/**
 * `bun infra/tools/main.ts [--port P] [--host H] [--secret S]`: the same
 * server without the CLI (defaults: port 8123, host 127.0.0.1).
 * @throws Error for an unknown flag or a port that is not an integer 0..65535.
 */
export async function runToolsCommand(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: { port: { type: "string", default: "8123" }, host: { type: "string", default: "127.0.0.1" }, secret: { type: "string" } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535 || values.port!.trim() === "") throw new Error(`--port must be an integer 0..65535, got '${values.port}'`);
  await serveTools({ port, host: values.host!, ...(values.secret ? { secret: values.secret } : {}) });
}

if (import.meta.main) {
  try {
    await runToolsCommand(process.argv.slice(2));
  } catch (e) {
    const err = e as { code?: string; message?: string };
    console.error(err.code === "EADDRINUSE" ? `tools: ${err.message} (pick another with --port)` : `tools: ${err.message ?? String(e)}`);
    if (process.env.EDGELOOP_DEBUG === "1") console.error((e as Error).stack);
    process.exit(2);
  }
}
