import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { hugeReply } from "../helpers/hostile-servers.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 S2, measured: a tool answering 300 MB costs the calling process the cap plus a constant.
// The call runs in a child process (bench/outbound-rss.ts --child) whose peak RSS (VmHWM) is compared
// with its RSS just before the call; the server streams from this process and never allocates the reply.
const huge = hugeReply(300 * 1024 * 1024);
afterAll(() => huge.stop());

test.skipIf(process.platform !== "linux")("a 300 MB tool reply: peak RSS under idle + 100 MB, the observation names the cap", async () => {
  const p = Bun.spawn([process.execPath, join(import.meta.dir, "..", "..", "bench", "outbound-rss.ts"), "--child", `${huge.base}/calc`], { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  expect({ code, err }).toEqual({ code: 0, err: "" });
  const r = JSON.parse(out.trim()) as { idle_kb: number; peak_kb: number; content: string };
  expect(r.content).toBe("Error executing tool 'calc': the reply is larger than 4194304 bytes (the tool's max_reply_bytes)");
  expect(r.peak_kb - r.idle_kb).toBeLessThan(100 * 1024);
}, HANG_MS);
