import { parseArgs } from "node:util";
import { startExampleEnv } from "./example-env.ts";

/**
 * `bun infra/openenv/main.ts [--port P] [--host H]`: serves the example
 * OpenEnv environment (guess-the-number, {@link startExampleEnv}) until
 * SIGINT/SIGTERM (defaults: port 8124, host 127.0.0.1).
 * @throws Error for an unknown flag or a port that is not an integer 0..65535.
 */
export async function runExampleEnvCommand(argv: string[]): Promise<void> {
  const { values } = parseArgs({ args: argv, options: { port: { type: "string", default: "8124" }, host: { type: "string", default: "127.0.0.1" } } });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535 || values.port!.trim() === "") throw new Error(`--port must be an integer 0..65535, got '${values.port}'`);
  const server = startExampleEnv({ port, hostname: values.host! });
  console.log(`example OpenEnv environment (guess_number) on ${server.url} (POST /reset, POST /step, GET /state, WS ${server.url.replace("http://", "ws://")}/ws)`);
  await new Promise<void>((resolve) => {
    const stop = () => void server.stop().then(resolve);
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}

if (import.meta.main) {
  try {
    await runExampleEnvCommand(process.argv.slice(2));
  } catch (e) {
    const err = e as { code?: string; message?: string };
    console.error(err.code === "EADDRINUSE" ? `openenv example: ${err.message} (pick another with --port)` : `openenv example: ${err.message ?? String(e)}`);
    process.exit(2);
  }
}
