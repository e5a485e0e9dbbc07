import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { SIGNATURE_HEADER, signatureHeader } from "../../shared/tools/signature.ts";

// `edgeloop sandbox-provider` and `bun infra/sandbox/main.ts`: the example sandbox provider as a process.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const SANDBOX_MAIN = join(import.meta.dir, "..", "..", "infra", "sandbox", "main.ts");
const BASE_ENV = { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "", EDGELOOP_TOOLS_SECRET: "", EDGELOOP_TOOLS_SECRET_FILE: "" };

/** The first line the process prints on stdout. */
async function firstLine(p: { stdout: ReadableStream<Uint8Array> }): Promise<string> {
  const reader = p.stdout.getReader();
  let out = "";
  while (!out.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return out;
}

const LINE = /^edgeloop sandbox provider on (http:\/\/127\.0\.0\.1:\d+) \(POST \/sandboxes\/create, \/sandboxes\/release, \/sandboxes\/heartbeat; tools POST \/tools\/sbx_write, \/tools\/sbx_read; GET \/stats\)(, signatures required)?\n$/;
const body = JSON.stringify({ lease_id: "k_0_0~1", key: "k_0_0", create_kwargs: {}, lifetime_s: 60 });
const createAt = (url: string, headers: Record<string, string> = {}) => fetch(`${url}/sandboxes/create`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });

describe("edgeloop sandbox-provider", () => {
  test("--secret-env VAR: the secret comes from that variable; unsigned creates are 401, signed ones made; SIGTERM exits 0", async () => {
    const p = Bun.spawn([process.execPath, MAIN, "sandbox-provider", "--port", "0", "--secret-env", "SBX_TEST_SECRET"], { stdout: "pipe", stderr: "pipe", env: { ...BASE_ENV, SBX_TEST_SECRET: "s3" } });
    try {
      const m = LINE.exec(await firstLine(p));
      expect(m?.[2]).toBe(", signatures required");
      const url = m![1]!;
      expect((await createAt(url)).status).toBe(401);
      const signed = await createAt(url, { [SIGNATURE_HEADER]: await signatureHeader("s3", body, Date.now() / 1000) });
      expect(signed.status).toBe(200);
      const stats = (await (await fetch(`${url}/stats`)).json()) as { live: number; created: number };
      expect([stats.live, stats.created]).toEqual([1, 1]);
    } finally {
      p.kill("SIGTERM");
    }
    expect(await p.exited).toBe(0);
  });

  test("without --secret-env and EDGELOOP_TOOLS_SECRET unset, no signature is required", async () => {
    const p = Bun.spawn([process.execPath, SANDBOX_MAIN, "--port", "0"], { stdout: "pipe", stderr: "pipe", env: BASE_ENV });
    try {
      const m = LINE.exec(await firstLine(p));
      expect(m?.[2]).toBeUndefined();
      expect(await (await createAt(m![1]!)).json()).toEqual({ sandbox_id: expect.stringMatching(/^sbx-[0-9a-f]{6}-1$/) });
    } finally {
      p.kill("SIGTERM");
    }
    expect(await p.exited).toBe(0);
  });

  test("a --secret-env naming an unset variable, or a bad port, is one line and exit code 2", () => {
    const a = Bun.spawnSync([process.execPath, MAIN, "sandbox-provider", "--port", "0", "--secret-env", "SBX_UNSET_SECRET"], { stdout: "pipe", stderr: "pipe", env: BASE_ENV });
    expect([a.exitCode, a.stderr.toString()]).toEqual([2, "edgeloop: --secret-env: SBX_UNSET_SECRET (or SBX_UNSET_SECRET_FILE) is not set\n"]);
    const b = Bun.spawnSync([process.execPath, SANDBOX_MAIN, "--port", "x"], { stdout: "pipe", stderr: "pipe", env: BASE_ENV });
    expect([b.exitCode, b.stderr.toString()]).toEqual([2, "sandbox-provider: --port must be an integer 0..65535, got 'x'\n"]);
  });
});
