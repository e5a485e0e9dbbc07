import { createServer } from "node:net";

/**
 * A free loopback TCP port: bound once on 127.0.0.1 with port 0, then
 * released (another process may take it before the caller binds it; the
 * chaos runs and tests use it for processes that need a fixed port across
 * restarts).
 */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
