import { parseArgs } from "node:util";
import { InputError } from "../../shared/errors.ts";
import { secretFromEnv } from "../cli/secrets.ts";
import { startSandboxProvider } from "./provider.ts";

/** The environment variable the signing secret is read from when `--secret-env` is not given (the tool webhooks' secret). */
export const DEFAULT_SANDBOX_SECRET_ENV = "EDGELOOP_TOOLS_SECRET";

/** Options of {@link serveSandboxProvider} (the flags of `edgeloop sandbox-provider`). */
export interface ServeSandboxProviderOptions {
  /** Port to listen on (0: a free one). */
  port: number;
  /** Address to bind. */
  host: string;
  /**
   * The environment variable holding the HMAC secret requests must be signed
   * with (or `<VAR>_FILE`, a file holding it); it must then be set. Without
   * it, `EDGELOOP_TOOLS_SECRET` when set, else no signatures are required.
   */
  secretEnv?: string;
  /** Each sandbox runs its own example OpenEnv environment at `/envs/{sandbox_id}` and create replies carry `base_url` (`SandboxPoolOptions.openenv`). */
  openenv?: boolean;
}

/**
 * `edgeloop sandbox-provider [--port P] [--host H] [--secret-env VAR] [--openenv]`: runs
 * the example sandbox provider (infra/sandbox/provider.ts) until
 * SIGINT/SIGTERM. Prints one line naming its routes. A port in use throws
 * Bun's EADDRINUSE error (the CLI prints it as one line).
 * @throws InputError naming `--secret-env` when that variable (and its `_FILE`) is unset,
 *   or the variable when its file cannot be read (secretFromEnv).
 */
export async function serveSandboxProvider(opts: ServeSandboxProviderOptions): Promise<void> {
  const secret = secretFromEnv(opts.secretEnv ?? DEFAULT_SANDBOX_SECRET_ENV) ?? undefined;
  if (opts.secretEnv && !secret) throw new InputError("--secret-env", `${opts.secretEnv} (or ${opts.secretEnv}_FILE) is not set`);
  const server = startSandboxProvider({ port: opts.port, hostname: opts.host, ...(secret ? { secret } : {}), ...(opts.openenv ? { openenv: true } : {}) });
  console.log(
    `edgeloop sandbox provider on ${server.url} (POST /sandboxes/create, /sandboxes/release, /sandboxes/heartbeat; tools POST /tools/sbx_write, /tools/sbx_read; ${opts.openenv ? "OpenEnv per sandbox at /envs/{sandbox_id}; " : ""}GET /stats)${secret ? ", signatures required" : ""}`,
  );
  await new Promise<void>((resolve) => {
    const stop = () => void server.stop().then(resolve);
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}

/**
 * `bun infra/sandbox/main.ts [--port P] [--host H] [--secret-env VAR] [--openenv]`: the
 * same provider without the CLI (defaults: port 8125, host 127.0.0.1).
 * @throws Error for an unknown flag or a port that is not an integer 0..65535.
 */
export async function runSandboxProviderCommand(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: { port: { type: "string", default: "8125" }, host: { type: "string", default: "127.0.0.1" }, "secret-env": { type: "string" }, openenv: { type: "boolean" } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535 || values.port!.trim() === "") throw new Error(`--port must be an integer 0..65535, got '${values.port}'`);
  await serveSandboxProvider({ port, host: values.host!, ...(values["secret-env"] ? { secretEnv: values["secret-env"] } : {}), ...(values.openenv ? { openenv: true } : {}) });
}

if (import.meta.main) {
  try {
    await runSandboxProviderCommand(process.argv.slice(2));
  } catch (e) {
    const err = e as { code?: string; message?: string };
    console.error(err.code === "EADDRINUSE" ? `sandbox-provider: ${err.message} (pick another with --port)` : `sandbox-provider: ${err.message ?? String(e)}`);
    if (process.env.EDGELOOP_DEBUG === "1") console.error((e as Error).stack);
    process.exit(2);
  }
}
