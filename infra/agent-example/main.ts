import { startAgentServer } from "./server.ts";

/** Options of {@link serveAgentExample} (the flags of `edgeloop agent-example`). */
export interface ServeAgentExampleOptions {
  /** Port to listen on (0: a free one). */
  port: number;
  /** Address to bind. */
  host: string;
  /** HMAC secret tasks must be signed with; default `EDGELOOP_AGENT_SECRET`, none when neither is set. */
  secret?: string;
  /** Most chat-completion calls per task (default 8). */
  maxSteps?: number;
}

/**
 * `edgeloop agent-example [--port P] [--host H] [--secret S] [--max-steps N]`:
 * runs the example calculator agent's webhook until SIGINT/SIGTERM, then
 * aborts the runs in progress (they finish their sessions with an error) and
 * exits. Prints `edgeloop example agent on http://H:P/tasks`. A port in use
 * throws Bun's EADDRINUSE error (the CLI prints it as one line).
 */
export async function serveAgentExample(opts: ServeAgentExampleOptions): Promise<void> {
  const secret = opts.secret ?? (process.env.EDGELOOP_AGENT_SECRET || undefined);
  const server = startAgentServer({ port: opts.port, hostname: opts.host, secret, maxSteps: opts.maxSteps });
  console.log(`edgeloop example agent on ${server.url}/tasks`);
  await new Promise<void>((resolve) => {
    const stop = () => void server.stop().then(resolve);
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}
