import { createAgentApp, type AgentAppOptions } from "./app.ts";
import { listen } from "../cli/listen.ts";

/** Options of {@link startAgentServer}: the app's options plus where to listen. */
export interface AgentServerOptions extends AgentAppOptions {
  /** Port to listen on (default 0: a free one). */
  port?: number;
  /** Address to bind (default `127.0.0.1`). */
  hostname?: string;
}

/** A running example agent server. */
export interface AgentServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`; the webhook (`agent.url`) is `${url}/tasks`. */
  url: string;
  port: number;
  /** Runs in progress. */
  readonly running: number;
  /**
   * Stops taking tasks, aborts the runs in progress (each still POSTs its
   * finish with `metadata.error`), waits for them, then closes the server.
   */
  stop(): Promise<void>;
}

/**
 * Starts the example agent's webhook ({@link createAgentApp}) with `Bun.serve`.
 * @throws Bun's EADDRINUSE error when the port is taken; ConfigError for a bad `maxSteps`.
 */
export function startAgentServer(opts: AgentServerOptions = {}): AgentServer {
  const hostname = opts.hostname ?? "127.0.0.1";
  const agent = createAgentApp(opts);
  const server = listen({ port: opts.port ?? 0, hostname, fetch: agent.app.fetch });
  const port = server.port!;
  let stopping: Promise<void> | undefined;
  return {
    url: `http://${hostname.includes(":") ? `[${hostname}]` : hostname}:${port}`,
    port,
    get running() {
      return agent.running;
    },
    stop() {
      stopping ??= (async () => {
        void server.stop(false);
        agent.abortAll();
        await agent.idle();
        await server.stop(true);
      })();
      return stopping;
    },
  };
}
