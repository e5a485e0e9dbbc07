import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startSandboxProvider } from "../../infra/sandbox/provider.ts";
import { waitFor } from "../helpers/wait.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `edgeloop rollout` interrupted (SIGINT) while its trajectories hold sandboxes: the run is cancelled, so every
// sandbox is released once with reason `cancelled` (it was `failed`: the runtime closed under the running loops).
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-sbx-sigint-"));
const provider = startSandboxProvider({ port: 0 });
afterAll(async () => {
  await provider.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe("SIGINT of a rollout whose trajectories hold sandboxes", () => {
  test("exit 130; each of the 2 sandboxes in use is released once, as cancelled; none live", async () => {
    const tools = JSON.parse(readFileSync(join(ROOT, "examples", "sandbox-tools.json"), "utf8").replaceAll("http://127.0.0.1:8125/", `${provider.url}/`));
    writeFileSync(join(dir, "tools.json"), JSON.stringify({ ...tools, sandbox: { ...tools.sandbox, create: "start" } }));
    // Each trajectory writes a file in its sandbox, then its second turn hangs: both hold a confirmed sandbox at the interrupt.
    const write = '<tool_call>\n{"name": "sbx_write", "arguments": {"path": "a.txt", "content": "1"}}\n</tool_call>';
    writeFileSync(join(dir, "hang.json"), JSON.stringify({ seed: 1, rules: [{ when: "HANG", turns: [write, "#### 1"], fault: { kind: "hang", turn: 1 } }], default: ["#### 1"] }));
    writeFileSync(join(dir, "rows.jsonl"), '{"agent_name":"tool_agent","prompt":[{"role":"user","content":"HANG"}]}\n');
    const p = Bun.spawn([process.execPath, MAIN, "rollout", "--data", "rows.jsonl", "--n", "2", "--tools", "tools.json", "--script", "hang.json", "--out", "out.jsonl", "--no-progress"], {
      cwd: dir,
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "" },
    });
    const stderr = new Response(p.stderr).text();
    await waitFor(() => provider.stats().tool_calls === 2, "both trajectories' calls in their sandboxes", HANG_MS);
    p.kill("SIGINT");
    expect(await p.exited).toBe(130);
    expect(await stderr).toContain("interrupted: 0 of 2 records written to out.jsonl (SIGINT)");
    expect(provider.stats()).toMatchObject({ created: 2, live: 0, releases: 2, release_not_found: 0, releases_by_reason: { cancelled: 2 } });
  }, HANG_MS);
});
