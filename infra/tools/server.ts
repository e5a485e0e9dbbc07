import { createToolsApp, type ToolsAppOptions } from "./app.ts";
import { listen } from "../cli/listen.ts";

/** A running example tool server. */
export interface ToolServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`; tools are at `${url}/tools/<name>`. */
  url: string;
  port: number;
  stop(): Promise<void>;
}

/**
 * Starts the example tool server ({@link createToolsApp}) with `Bun.serve`;
 * `port: 0` (the default) picks a free port.
 */
export function startToolServer(opts: ToolsAppOptions & { port?: number; hostname?: string } = {}): ToolServer {
  const hostname = opts.hostname ?? "127.0.0.1";
  const app = createToolsApp(opts);
  const server = listen({ port: opts.port ?? 0, hostname, fetch: app.fetch });
  const port = server.port!;
  return {
    url: `http://${hostname}:${port}`,
    port,
    stop: async () => {
      await server.stop(true);
    },
  };
}
