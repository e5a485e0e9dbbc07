import { join } from "node:path";

const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");

/**
 * Starts `edgeloop gateway …args` (a real process), waits for its first stdout
 * line (the start line) and returns the URL it prints and that line. The
 * process is pushed onto `procs` for the caller's afterAll to stop.
 * @throws Error with the gateway's stderr when it exits before printing.
 */
export async function startGatewayProcess(
  args: string[],
  procs: ReturnType<typeof Bun.spawn>[],
  env: Record<string, string | undefined> = {},
): Promise<{ url: string; banner: string }> {
  const p = Bun.spawn([process.execPath, MAIN, "gateway", ...args], { stdout: "pipe", stderr: "pipe", env: { ...process.env, ...env } });
  procs.push(p);
  const reader = (p.stdout as ReadableStream<Uint8Array>).getReader();
  let out = "";
  while (!out.includes("\n")) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`gateway exited: ${await new Response(p.stderr as ReadableStream<Uint8Array>).text()}`);
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return { url: /on (http:\/\/\S+)/.exec(out)![1]!, banner: out.trim() };
}
