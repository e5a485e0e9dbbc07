/**
 * A stopped `serve` never hangs on work that cannot finish (a fresh-user
 * trial: an inline serve with agent sessions waiting for their finish stayed
 * alive for 32 minutes after SIGTERM). The listener closes at once; running
 * work gets `--drain-timeout` seconds; then serve exits 1 naming what it
 * left. With nothing running it exits 0.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { post, spawnServe, type CliProc } from "../chaos/store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const ROOT = join(import.meta.dir, "..", "..");
const row = JSON.parse(readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0]!);
const procs: CliProc[] = [];
afterAll(() => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill(9);
});

describe("serve on SIGTERM", () => {
  test("an agent session that never finishes: the listener closes, and after --drain-timeout serve exits 1 naming what it left", async () => {
    let gotTask!: () => void;
    const taskArrived = new Promise<void>((r) => (gotTask = r));
    // An agent that accepts its task and never calls back.
    const agent = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: async (req) => (await req.text(), gotTask(), new Response(null, { status: 202 })) });
    try {
      const s = await spawnServe(["--jobs", "inline", "--agent", `http://127.0.0.1:${agent.port}/tasks`, "--drain-timeout", "1"]);
      procs.push(s);
      await post(s.url, [{ ...row, agent_name: "openai_agent", uid: "drain0" }]);
      await taskArrived;
      s.proc.kill("SIGTERM");
      expect(await s.proc.exited).toBe(1);
      expect(s.err()).toContain("serve      stopped with 1 trajectories still running (--drain-timeout 1 s, or a second signal): they are not recorded");
      // The port was released.
      expect(await fetch(`${s.url}/health`).then(() => "answered", () => "refused")).toBe("refused");
    } finally {
      agent.stop(true);
    }
  }, HANG_MS);

  test("nothing running: SIGTERM exits 0", async () => {
    const s = await spawnServe(["--jobs", "inline"]);
    procs.push(s);
    s.proc.kill("SIGTERM");
    expect(await s.proc.exited).toBe(0);
    expect(s.err()).not.toContain("still running");
  }, HANG_MS);
});
