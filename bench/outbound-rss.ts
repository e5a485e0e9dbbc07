/**
 * Peak memory of a tool that answers 300 MB (issue 26, S2): `bun bench/outbound-rss.ts [--mb 300]`.
 *
 * A loopback tool server (this process) streams `200 {"content":"AAAA…` of
 * `--mb` MB, never allocated whole. Measured in child processes, by the
 * kernel's peak resident set (`VmHWM`, or GNU time's `%M`):
 * 1. `call`: one `WebhookToolClient.call` in a fresh Bun process; peak RSS
 *    over the RSS just before the call (modules loaded, after a GC);
 * 2. `rollout`: `edgeloop rollout` of one row whose `calc` tool is that
 *    server (the audit's repro), against the same rollout with a tool
 *    answering a few bytes: the difference of their max RSS.
 * Target: the cap (4 MiB) plus a constant, under 100 MB over idle.
 * `--child URL` runs step 1's child and prints `{idle_kb, peak_kb, content}`.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { arg, printTable } from "./util.ts";

const ROOT = join(import.meta.dir, "..");

/** `VmRSS` / `VmHWM` of this process, KiB (Linux). */
function procKb(field: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync("/proc/self/status", "utf8"));
  return m ? Number(m[1]) : NaN;
}

async function child(url: string): Promise<void> {
  const { WebhookToolClient } = await import("../shared/tools/webhook-tool-client.ts");
  const { ToolSpec } = await import("../shared/schema/index.ts");
  const spec = ToolSpec.parse({ name: "calc", url, schema: { type: "function", function: { name: "calc" } }, timeout_ms: 120_000, max_retries: 0 });
  const client = new WebhookToolClient([spec]);
  Bun.gc(true);
  const idle = procKb("VmRSS");
  const res = await client.call({ name: "calc", arguments: {}, key: "u_0_0", turn: 1, index: 0 });
  console.log(JSON.stringify({ idle_kb: idle, peak_kb: procKb("VmHWM"), content: res.content }));
}

/** A loopback server answering `{"content":"AAAA…` of `bytes` bytes, streamed in 64 KiB chunks. */
function hugeTool(bytes: number) {
  let sent = 0;
  const chunk = new Uint8Array(64 * 1024).fill(0x41);
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 120,
    fetch: (req) => {
      if (new URL(req.url).pathname === "/small") return Response.json({ content: "31" });
      let n = 0;
      return new Response(
        new ReadableStream<Uint8Array>({
          pull(c) {
            if (n === 0) c.enqueue(new TextEncoder().encode('{"content":"'));
            if (n >= bytes) return c.close();
            n += chunk.byteLength;
            sent += chunk.byteLength;
            c.enqueue(chunk);
          },
        }),
        { headers: { "content-type": "application/json" } },
      );
    },
  });
  return { url: `http://127.0.0.1:${server.port}`, sent: () => sent, stop: () => server.stop(true) };
}

/** Max RSS (KiB) of one `edgeloop rollout` whose calc tool is at `toolUrl`, by GNU time. */
async function rolloutMaxRss(dir: string, toolUrl: string, name: string): Promise<{ kb: number; observation: string }> {
  const example = JSON.parse(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", "1"));
  example.tools[0].url = toolUrl;
  example.tools[0].max_retries = 0;
  example.tools[0].timeout_ms = 120_000;
  writeFileSync(join(dir, `${name}.json`), JSON.stringify(example));
  writeFileSync(join(dir, "row.jsonl"), readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0] + "\n");
  const out = join(dir, `${name}.out.jsonl`);
  const p = Bun.spawn(["/usr/bin/time", "-f", "%M", process.execPath, join(ROOT, "infra", "cli", "main.ts"), "rollout", "--data", join(dir, "row.jsonl"), "--tools", join(dir, `${name}.json`), "--out", out, "--no-progress"], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, NO_COLOR: "1" },
  });
  const [stderr, code] = await Promise.all([new Response(p.stderr).text(), p.exited]);
  if (code !== 0) throw new Error(`rollout exited ${code}: ${stderr}`);
  const kb = Number(stderr.trim().split("\n").at(-1));
  const rec = JSON.parse(readFileSync(out, "utf8").trim()) as { response_ids: number[] };
  const { defaultTokenizer } = await import("../shared/tokens/tokenizer.ts");
  const text = (await defaultTokenizer()).decode(rec.response_ids);
  const obs = /<tool_response>\n([^\n]*)\n<\/tool_response>/.exec(text)?.[1] ?? "(no observation)";
  return { kb, observation: obs };
}

if (process.argv.includes("--child")) {
  await child(arg("--child", ""));
} else {
  const mb = Number(arg("--mb", "300"));
  const tool = hugeTool(mb * 1024 * 1024);
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-rss-"));
  try {
    const p = Bun.spawn([process.execPath, import.meta.path, "--child", `${tool.url}/calc`], { stdout: "pipe", stderr: "inherit" });
    const r = JSON.parse((await new Response(p.stdout).text()).trim()) as { idle_kb: number; peak_kb: number; content: string };
    await p.exited;
    const small = await rolloutMaxRss(dir, `${tool.url}/small`, "small");
    const huge = await rolloutMaxRss(dir, `${tool.url}/calc`, "huge");
    const MB = (kb: number) => (kb / 1024).toFixed(1);
    printTable(`tool answering ${mb} MB (cap 4 MiB; target < 100 MB over idle)`, [
      ["measure", "idle MB", "peak MB", "over idle MB", "what the model sees"],
      ["WebhookToolClient.call (child process, VmHWM)", MB(r.idle_kb), MB(r.peak_kb), MB(r.peak_kb - r.idle_kb), r.content],
      ["edgeloop rollout, 1 row (GNU time %M): 2-byte tool vs huge tool", MB(small.kb), MB(huge.kb), MB(huge.kb - small.kb), huge.observation],
    ]);
    console.log(`server pushed ${(tool.sent() / 1024 / 1024).toFixed(1)} MB into the socket before the clients hung up (of ${mb} MB)`);
    if (r.peak_kb - r.idle_kb > 100 * 1024 || huge.kb - small.kb > 100 * 1024) {
      console.error("over target: more than 100 MB over idle");
      process.exitCode = 1;
    }
  } finally {
    tool.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
