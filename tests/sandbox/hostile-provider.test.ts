import { afterEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SandboxSpec } from "../../shared/schema/index.ts";
import { MemoryLeaseStore } from "../../shared/tools/lease-store.ts";
import { SandboxCreateError, SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Providers that break the contract or are not there: each fails its trajectory promptly, naming the cause,
// and never leaves the run waiting on a lease it cannot release.

const ROOT = join(import.meta.dir, "..", "..");
const servers: { stop: (force?: boolean) => unknown }[] = [];
const managers: SandboxLeases[] = [];
afterEach(() => {
  for (const m of managers.splice(0)) m.stop();
  for (const s of servers.splice(0)) void s.stop(true);
});

type Counts = { create: number; release: number };
/** A provider whose create and release answer with `create` / `release` (a Response, or "hang"), counting each. */
function hostile(create: () => Response, release: () => Response) {
  const counts: Counts = { create: 0, release: 0 };
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const op = new URL(req.url).pathname.split("/").pop();
      if (op === "create") return counts.create++, create();
      if (op === "release") return counts.release++, release();
      return new Response("", { status: 404 });
    },
  });
  servers.push(server);
  return { url: `http://127.0.0.1:${server.port}`, counts };
}

/** A URL where nothing listens: a server started and stopped. */
async function refusedUrl(): Promise<string> {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
  const url = `http://127.0.0.1:${s.port}`;
  await s.stop(true);
  return url;
}

function manager(base: string, extra: Record<string, unknown> = {}, now?: () => number): SandboxLeases {
  const spec = SandboxSpec.parse({ create_url: `${base}/sandboxes/create`, release_url: `${base}/sandboxes/release`, ttl_s: 30, create_timeout_ms: 2_000, release_timeout_ms: 1_000, release_retries: 0, create_retries: 2, ...extra });
  const m = new SandboxLeases(spec, new MemoryLeaseStore(now ? { now } : {}), { trajectoryDeadlineS: 600, random: () => 0.5, backoffMinMs: 5, backoffMaxMs: 20 });
  managers.push(m);
  return m;
}

const createError = (p: Promise<unknown>) => p.then(() => { throw new Error("resolved"); }, (e: unknown) => e as SandboxCreateError);

describe("SandboxLeases against a hostile provider", () => {
  test("a reply without a valid sandbox_id fails after 1 attempt (not 0), released by its lease id, not retried", async () => {
    for (const body of [{}, { sandbox_id: "" }, { sandbox_id: 7 }, { sandbox_id: "x".repeat(257) }]) {
      const p = hostile(() => Response.json(body), () => new Response(null, { status: 200 }));
      const m = manager(p.url);
      const e = await createError(m.ensure("k_0_0", {}, { fresh: true }));
      expect(e).toBeInstanceOf(SandboxCreateError);
      expect(e.message).toStartWith(`sandbox create for 'k_0_0' failed after 1 attempt: sandbox create ${p.url}/sandboxes/create: reply has no valid sandbox_id`);
      expect(p.counts).toEqual({ create: 1, release: 1 });
      expect(await m.store.get("k_0_0")).toMatchObject({ status: "released", reason: "create_failed", lease_id: "k_0_0~1" });
    }
  });

  test("a 4xx and a non-JSON 200 fail after 1 attempt; a 500 after create_retries + 1", async () => {
    const cases: [() => Response, number, string][] = [
      [() => new Response("bad kwargs", { status: 400 }), 1, "failed after 1 attempt: webhook URL: HTTP 400 bad kwargs"],
      [() => new Response("<html>", { status: 200 }), 1, "failed after 1 attempt: webhook URL: HTTP 200 reply is not JSON"],
      [() => new Response("boom", { status: 500 }), 3, "failed after 3 attempts: webhook URL: HTTP 500"],
    ];
    for (const [create, attempts, message] of cases) {
      const p = hostile(create, () => new Response(null, { status: 200 }));
      const m = manager(p.url);
      const e = await createError(m.ensure("k_0_0", {}, { fresh: true }));
      expect(e.message).toBe(`sandbox create for 'k_0_0' ${message.replace("URL", `${p.url}/sandboxes/create`)}`);
      // Each attempt's lease is released by its id; the default create_retries is 2.
      expect(p.counts).toEqual({ create: attempts, release: attempts });
    }
  });

  test("create and release both refused (nothing listens): the trajectory fails at once naming both URLs, the lease left for the reaper", async () => {
    const url = await refusedUrl();
    const m = manager(url);
    const e = await createError(m.ensure("k_0_0", {}, { fresh: true }));
    expect(e).toBeInstanceOf(SandboxCreateError);
    expect(e.message).toStartWith(`sandbox create for 'k_0_0' failed after 1 attempt: webhook ${url}/sandboxes/create: connection failed`);
    expect(e.message).toContain(`; its release by lease id k_0_0~1 failed too (webhook ${url}/sandboxes/release: connection failed`);
    expect(e.message).toEndWith("), left to the reaper");
    expect(await m.store.get("k_0_0")).toMatchObject({ status: "releasing", reason: "create_failed", lease_id: "k_0_0~1" });
    expect(m.unreleased()).toEqual({ lease_ids: ["k_0_0~1"], last_error: expect.stringContaining(`webhook ${url}/sandboxes/release: connection failed`) });
  });

  test("a create that 500s and a release that 500s: one attempt, not a wait on the releasing lease until the deadline", async () => {
    const p = hostile(() => new Response("", { status: 500 }), () => new Response("", { status: 500 }));
    const m = manager(p.url);
    const e = await createError(m.ensure("k_0_0", {}, { fresh: true }));
    expect(e.message).toBe(`sandbox create for 'k_0_0' failed after 1 attempt: webhook ${p.url}/sandboxes/create: HTTP 500; its release by lease id k_0_0~1 failed too (webhook ${p.url}/sandboxes/release: HTTP 500), left to the reaper`);
    expect(p.counts).toEqual({ create: 1, release: 1 });
  });

  test("a live sandbox whose release keeps failing is reported by unreleased(), and leaves it once a later release succeeds", async () => {
    let releaseStatus = 500;
    let t = 1_000_000;
    const p = hostile(() => Response.json({ sandbox_id: "sb-1" }), () => new Response(null, { status: releaseStatus }));
    const m = manager(p.url, {}, () => t);
    await m.ensure("k_0_0", {}, { fresh: true });
    expect(await m.release("k_0_0", "finished")).toBe(false);
    expect(m.unreleased()).toEqual({ lease_ids: ["k_0_0~1"], last_error: `webhook ${p.url}/sandboxes/release: HTTP 500` });
    expect(m.metrics.release_failures).toBe(1);
    expect(await m.store.get("k_0_0")).toMatchObject({ status: "releasing" });
    // The reaper: once the release's hold has passed it claims the lease again, and this time the provider answers.
    releaseStatus = 200;
    t += 10 * 60_000;
    expect(await m.reapOnce()).toBe(1);
    expect(await m.store.get("k_0_0")).toMatchObject({ status: "released" });
    expect(m.unreleased()).toEqual({ lease_ids: [], last_error: null });
  });
});

describe("edgeloop rollout against a provider where nothing listens", () => {
  test("every trajectory fails naming the create URL, the batch finishes (exit 1), and the unreleased leases are reported once at exit", async () => {
    const url = await refusedUrl();
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-hostile-"));
    try {
      const tools = JSON.parse(readFileSync(join(ROOT, "examples", "sandbox-tools.json"), "utf8")) as { sandbox: Record<string, unknown> };
      Object.assign(tools.sandbox, { create_url: `${url}/sandboxes/create`, release_url: `${url}/sandboxes/release`, heartbeat_url: `${url}/sandboxes/heartbeat`, release_retries: 0, headers: { authorization: "Bearer HIDDEN-TOKEN" } });
      writeFileSync(join(dir, "tools.json"), JSON.stringify(tools));
      const p = Bun.spawn(
        [process.execPath, join(ROOT, "infra", "cli", "main.ts"), "rollout", "--data", join(ROOT, "examples", "sandbox-notes.jsonl"), "--tools", join(dir, "tools.json"), "--script", join(ROOT, "examples", "policy-sandbox.json"), "--n", "2", "--out", join(dir, "out.jsonl")],
        { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "" } },
      );
      const [code, stdout, stderr] = await Promise.all([p.exited, new Response(p.stdout).text(), new Response(p.stderr).text()]);
      expect(code).toBe(1);
      const records = readFileSync(join(dir, "out.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { error: string | null; finish_reason: string });
      expect(records).toHaveLength(6);
      for (const r of records) expect([r.finish_reason, r.error]).toEqual(["error", expect.stringMatching(new RegExp(`^SandboxCreateError: sandbox create for '[^']+' failed after 1 attempt: webhook ${url}/sandboxes/create: connection failed`))]);
      const lines = stderr.split("\n").filter((l) => l.startsWith("edgeloop: sandbox:"));
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(new RegExp(`^edgeloop: sandbox: 6 leases could not be released \\(webhook ${url}/sandboxes/release: connection failed .*; e\\.g\\. \\S+~1\\): the memory store dies with this process, so no reaper will retry them: the provider's own lifetime_s \\(3630 s\\) is what destroys them$`));
      expect(stdout + stderr).not.toContain("HIDDEN-TOKEN");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, HANG_MS);
});
