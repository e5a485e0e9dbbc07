import { afterEach, describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { SandboxCreateReply } from "../../shared/schema/sandbox.ts";
import { SIGNATURE_HEADER, signatureHeader } from "../../shared/tools/signature.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { postWebhook } from "../../shared/tools/webhook-post.ts";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { sandboxFaultDecision, type SandboxProviderStats } from "../../infra/sandbox/sandboxes.ts";
import { waitFor } from "../helpers/wait.ts";

// The example sandbox provider (infra/sandbox) over loopback: the provider contract of shared/schema/sandbox.ts,
// its per-sandbox tools, lifetimes, faults and exact stats.

const SECRET = "sbx-secret";
const started: SandboxProvider[] = [];
afterEach(async () => {
  for (const p of started.splice(0)) await p.stop();
});

function provider(opts: Parameters<typeof startSandboxProvider>[0] = {}): SandboxProvider {
  const p = startSandboxProvider({ idPrefix: "sbx-", ...opts });
  started.push(p);
  return p;
}

interface Reply {
  status: number;
  body: unknown;
}

/** POSTs `body` (JSON; a string is sent as it is), signed with SECRET unless `sig` is given (null: unsigned). */
async function post(p: SandboxProvider, path: string, body: unknown, sig?: string | null, signal?: AbortSignal): Promise<Reply> {
  const raw = typeof body === "string" ? body : JSON.stringify(body);
  const headers: Record<string, string> = { "content-type": "application/json" };
  const s = sig === undefined ? await signatureHeader(SECRET, raw, Date.now() / 1000) : sig;
  if (s) headers[SIGNATURE_HEADER] = s;
  const res = await fetch(`${p.url}${path}`, { method: "POST", headers, body: raw, ...(signal ? { signal } : {}) });
  return { status: res.status, body: await res.json() };
}

const create = (lease_id: string, lifetime_s = 600, key = lease_id.split("~")[0]!) => ({ lease_id, key, create_kwargs: { image: "py" }, lifetime_s });
const release = (lease_id: string, sandbox_id: string | null = null, reason = "finished", key = lease_id.split("~")[0]!) => ({ lease_id, sandbox_id, key, reason });
const call = (call_id: string, name: string, args: Record<string, unknown>, sandbox?: { sandbox_id?: string; lease_id?: string }) => ({
  call_id,
  name,
  arguments: args,
  key: "u_0_0",
  turn: 1,
  create_kwargs: {},
  ...sandbox,
});

/** The stats with every count zero, overridden by `over` (the histogram and the releases by reason left out). */
function counts(over: Partial<SandboxProviderStats>): Omit<SandboxProviderStats, "creates_per_second" | "peak_creates_1s" | "releases_by_reason" | "env_requests"> {
  return {
    live: 0,
    creating: 0,
    created: 0,
    destroyed_released: 0,
    destroyed_expired: 0,
    duplicate_creates: 0,
    refused_released: 0,
    refused_expired: 0,
    cancelled_creates: 0,
    create_timeouts: 0,
    releases: 0,
    release_not_found: 0,
    release_faults: 0,
    heartbeats: 0,
    heartbeat_not_found: 0,
    tool_calls: 0,
    ...over,
  };
}
const countsOf = (p: SandboxProvider) => {
  const { creates_per_second: _h, peak_creates_1s: _p, releases_by_reason: _r, env_requests: _e, ...rest } = p.stats();
  return rest;
};

const released = (lease: string) => ({ status: 409, body: { error: { code: "conflict", message: `lease_id: lease '${lease}' was released; a released lease gets no sandbox`, field: "lease_id" } } });

describe("the create/release contract", () => {
  test("create is idempotent by lease_id: the same sandbox_id, one sandbox made", async () => {
    const p = provider();
    const a = await post(p, "/sandboxes/create", create("u_0_0~1"), null);
    const b = await post(p, "/sandboxes/create", create("u_0_0~1"), null);
    expect(a).toEqual({ status: 200, body: { sandbox_id: "sbx-1" } });
    expect(b).toEqual(a);
    expect(SandboxCreateReply.parse(a.body)).toEqual({ sandbox_id: "sbx-1" });
    expect((await post(p, "/sandboxes/create", create("u_1_0~1"), null)).body).toEqual({ sandbox_id: "sbx-2" });
    expect(countsOf(p)).toEqual(counts({ live: 2, created: 2, duplicate_creates: 1 }));
    // A lease id belongs to one trajectory key.
    expect(await post(p, "/sandboxes/create", create("u_0_0~1", 600, "other_0_0"), null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "key: lease 'u_0_0~1' belongs to key 'u_0_0', not 'other_0_0'", field: "key" } },
    });
  });

  test("release, then a create with the same lease id: 409 and nothing live; a second release is 404", async () => {
    const p = provider();
    expect((await post(p, "/sandboxes/create", create("k_0_0~1"), null)).body).toEqual({ sandbox_id: "sbx-1" });
    expect(await post(p, "/sandboxes/release", release("k_0_0~1", "sbx-1"), null)).toEqual({ status: 200, body: { ok: true, sandbox_id: "sbx-1" } });
    expect(await post(p, "/sandboxes/create", create("k_0_0~1"), null)).toEqual(released("k_0_0~1"));
    expect(await post(p, "/sandboxes/release", release("k_0_0~1", "sbx-1"), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "lease_id: lease 'k_0_0~1' was already released", field: "lease_id" } },
    });
    expect(countsOf(p)).toEqual(counts({ created: 1, destroyed_released: 1, releases: 1, refused_released: 1, release_not_found: 1 }));
    // By the reason of the release answered 2xx only (the 404 repeat is not counted).
    expect(p.stats().releases_by_reason).toEqual({ finished: 1 });
  });

  test("a release of an unknown lease id is 404, and the create that comes after it is refused (no sandbox left behind)", async () => {
    const p = provider();
    expect(await post(p, "/sandboxes/release", release("late_0_0~1", null, "create_failed"), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "lease_id: no sandbox for lease 'late_0_0~1' (it counts as released: a later create with it is refused)", field: "lease_id" } },
    });
    expect(await post(p, "/sandboxes/create", create("late_0_0~1"), null)).toEqual(released("late_0_0~1"));
    expect(countsOf(p)).toEqual(counts({ release_not_found: 1, refused_released: 1 }));
    expect(p.stats().creates_per_second).toEqual([]);
  });

  test("a release naming another sandbox than the lease's is 409 and destroys nothing", async () => {
    const p = provider();
    await post(p, "/sandboxes/create", create("m_0_0~1"), null);
    expect(await post(p, "/sandboxes/release", release("m_0_0~1", "sbx-9"), null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "sandbox_id: lease 'm_0_0~1' has sandbox 'sbx-1', not 'sbx-9'", field: "sandbox_id" } },
    });
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 1 }));
  });

  test("bad bodies are 400 naming the field", async () => {
    const p = provider();
    const bad = (field: string, message: string) => ({ status: 400, body: { error: { code: "invalid_input", message: `${field}: ${message}`, field } } });
    expect(await post(p, "/sandboxes/create", "{not json", null)).toEqual(bad("body", "not valid JSON"));
    expect(await post(p, "/sandboxes/create", { lease_id: "a~1", key: "a", create_kwargs: {} }, null)).toEqual(bad("body.lifetime_s", "Invalid input: expected number, received undefined"));
    expect(await post(p, "/sandboxes/create", { ...create("a~1"), lifetime_s: 1.5 }, null)).toEqual(bad("body.lifetime_s", "Invalid input: expected int, received number"));
    expect(await post(p, "/sandboxes/create", { ...create("a~1"), lifetime_s: 0 }, null)).toEqual(bad("body.lifetime_s", "Too small: expected number to be >0"));
    expect(await post(p, "/sandboxes/create", { ...create("a~1"), lifetime_s: 2147484 }, null)).toEqual(bad("body.lifetime_s", "must be <= 2147483 (seconds; setTimeout's largest delay)"));
    expect(await post(p, "/sandboxes/create", { ...create("a~1"), lease_id: "" }, null)).toEqual(bad("body.lease_id", "Too small: expected string to have >=1 characters"));
    expect(await post(p, "/sandboxes/create", { ...create("a~1"), create_kwargs: [] }, null)).toEqual(bad("body.create_kwargs", "Invalid input: expected record, received array"));
    expect(await post(p, "/sandboxes/release", { ...release("a~1"), reason: "bored" }, null)).toEqual(
      bad("body.reason", 'Invalid option: expected one of "finished"|"failed"|"cancelled"|"surplus"|"deadline"|"create_failed"|"reaped_ttl"|"reaped_create"|"reaped_release"'),
    );
    expect(await post(p, "/sandboxes/release", { ...release("a~1"), sandbox_id: "x".repeat(257) }, null)).toEqual(bad("body.sandbox_id", "Too big: expected string to have <=256 characters"));
    expect(await post(p, "/sandboxes/release", { lease_id: "a~1", key: "a", reason: "failed" }, null)).toEqual(bad("body.sandbox_id", "Invalid input: expected string, received undefined"));
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "a~1", lifetime_s: 60 }, null)).toEqual(bad("body.sandbox_id", "Invalid input: expected string, received undefined"));
    expect(await post(p, "/tools/sbx_read", { name: "sbx_read" }, null)).toEqual(bad("body.call_id", "Invalid input: expected string, received undefined (and 3 more issues)"));
    expect(countsOf(p)).toEqual(counts({}));
  });

  test("with a secret, every route needs a valid, fresh signature: 401 before the body is read", async () => {
    const p = provider({ secret: SECRET });
    const unauthorized = { status: 401, body: { error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } } };
    const stale = async (body: unknown) => signatureHeader(SECRET, JSON.stringify(body), Date.now() / 1000 - 301);
    const wrong = async (body: unknown) => signatureHeader("not-the-secret", JSON.stringify(body), Date.now() / 1000);
    const bodies: [string, unknown][] = [
      ["/sandboxes/create", create("s_0_0~1")],
      ["/sandboxes/release", release("s_0_0~1")],
      ["/sandboxes/heartbeat", { lease_id: "s_0_0~1", sandbox_id: "sbx-1", lifetime_s: 60 }],
      ["/tools/sbx_read", call("c:1:0", "sbx_read", { path: "a" }, { sandbox_id: "sbx-1" })],
    ];
    for (const [path, body] of bodies) {
      expect({ path, r: await post(p, path, body, null) }).toEqual({ path, r: unauthorized });
      expect({ path, r: await post(p, path, body, "t=1,v1=abc") }).toEqual({ path, r: unauthorized });
      expect({ path, r: await post(p, path, body, await stale(body)) }).toEqual({ path, r: unauthorized });
      expect({ path, r: await post(p, path, body, await wrong(body)) }).toEqual({ path, r: unauthorized });
      // Not valid JSON, unsigned: still 401, not 400.
      expect({ path, r: await post(p, path, "{", null) }).toEqual({ path, r: unauthorized });
    }
    expect(countsOf(p)).toEqual(counts({}));
    expect(await post(p, "/sandboxes/create", create("s_0_0~1"))).toEqual({ status: 200, body: { sandbox_id: "sbx-1" } });
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "s_0_0~1", sandbox_id: "sbx-1", lifetime_s: 60 })).toEqual({ status: 200, body: { ok: true } });
    expect(await post(p, "/sandboxes/release", release("s_0_0~1"))).toEqual({ status: 200, body: { ok: true, sandbox_id: "sbx-1" } });
    expect(countsOf(p)).toEqual(counts({ created: 1, heartbeats: 1, releases: 1, destroyed_released: 1 }));
  });

  test("heartbeat restarts the lifetime; 404 for an unknown or released sandbox, 409 for another lease's", async () => {
    const p = provider();
    // a is due first; its heartbeat moves it past b, so b's expiry finds a still live.
    await post(p, "/sandboxes/create", create("a_0_0~1", 1), null);
    await post(p, "/sandboxes/create", create("b_0_0~1", 1), null);
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "a_0_0~1", sandbox_id: "sbx-1", lifetime_s: 600 }, null)).toEqual({ status: 200, body: { ok: true } });
    await waitFor(() => p.stats().destroyed_expired === 1, "b's lifetime to run out");
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 2, destroyed_expired: 1, heartbeats: 1 }));
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "b_0_0~1", sandbox_id: "sbx-2", lifetime_s: 600 }, null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: sandbox 'sbx-2' was destroyed (its lifetime ran out)", field: "sandbox_id" } },
    });
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "a_0_0~1", sandbox_id: "sbx-7", lifetime_s: 600 }, null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: no sandbox 'sbx-7'", field: "sandbox_id" } },
    });
    expect(await post(p, "/sandboxes/heartbeat", { lease_id: "b_0_0~1", sandbox_id: "sbx-1", lifetime_s: 600 }, null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "lease_id: sandbox 'sbx-1' belongs to lease 'a_0_0~1', not 'b_0_0~1'", field: "lease_id" } },
    });
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 2, destroyed_expired: 1, heartbeats: 1, heartbeat_not_found: 2 }));
  });

  test("a sandbox past its lifetime_s is destroyed by the provider; its lease then refuses create, release and tools", async () => {
    const p = provider();
    expect((await post(p, "/sandboxes/create", create("e_0_0~1", 1), null)).body).toEqual({ sandbox_id: "sbx-1" });
    expect(p.stats().live).toBe(1);
    await waitFor(() => p.stats().destroyed_expired === 1, "the lifetime to run out");
    expect(countsOf(p)).toEqual(counts({ created: 1, destroyed_expired: 1 }));
    expect(await post(p, "/tools/sbx_read", call("e:1:0", "sbx_read", { path: "a" }, { sandbox_id: "sbx-1" }), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: sandbox 'sbx-1' was destroyed (its lifetime ran out)", field: "sandbox_id" } },
    });
    expect(await post(p, "/sandboxes/create", create("e_0_0~1"), null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "lease_id: the sandbox of lease 'e_0_0~1' was destroyed when its lifetime ran out; a lease gets one sandbox", field: "lease_id" } },
    });
    expect(await post(p, "/sandboxes/release", release("e_0_0~1", "sbx-1", "deadline"), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "lease_id: lease 'e_0_0~1' had its sandbox destroyed when its lifetime ran out", field: "lease_id" } },
    });
    // Released now: a create is refused as released.
    expect(await post(p, "/sandboxes/create", create("e_0_0~1"), null)).toEqual(released("e_0_0~1"));
    expect(countsOf(p)).toEqual(counts({ created: 1, destroyed_expired: 1, refused_expired: 1, release_not_found: 1, refused_released: 1 }));
  });
});

describe("the sandbox tools (tool-webhook contract, per-sandbox state)", () => {
  test("sbx_write and sbx_read act on the call's own sandbox; a repeated call id is executed once", async () => {
    const p = provider();
    await post(p, "/sandboxes/create", create("a_0_0~1"), null);
    await post(p, "/sandboxes/create", create("b_0_0~1"), null);
    const A = { sandbox_id: "sbx-1", lease_id: "a_0_0~1" };
    const B = { sandbox_id: "sbx-2" };
    expect(await post(p, "/tools/sbx_write", call("a:1:0", "sbx_write", { path: "notes.txt", content: "héllo" }, A), null)).toEqual({ status: 200, body: { content: "Wrote 6 bytes to notes.txt." } });
    expect(await post(p, "/tools/sbx_read", call("a:2:0", "sbx_read", { path: "notes.txt" }, A), null)).toEqual({ status: 200, body: { content: "héllo" } });
    expect(await post(p, "/tools/sbx_read", call("b:1:0", "sbx_read", { path: "notes.txt" }, B), null)).toEqual({ status: 200, body: { content: "Error: no file 'notes.txt' in this sandbox." } });
    expect(await post(p, "/tools/sbx_write", call("b:2:0", "sbx_write", { path: "notes.txt", content: "b's" }, B), null)).toEqual({ status: 200, body: { content: "Wrote 3 bytes to notes.txt." } });
    // The retry of a:2:0 after b's write: the first answer, not re-executed.
    expect(await post(p, "/tools/sbx_read", call("a:2:0", "sbx_read", { path: "notes.txt" }, A), null)).toEqual({ status: 200, body: { content: "héllo" } });
    expect(await post(p, "/tools/sbx_read", call("a:2:0", "sbx_read", { path: "other" }, A), null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "call_id 'a:2:0' was already used for a different call" } },
    });
    expect(await post(p, "/tools/sbx_write", call("a:3:0", "sbx_write", { path: "x" }, A), null)).toEqual({ status: 200, body: { content: "Error: sbx_write needs a string argument 'content'." } });
    expect(await post(p, "/tools/sbx_read", call("a:3:1", "sbx_read", {}, A), null)).toEqual({ status: 200, body: { content: "Error: sbx_read needs a non-empty string argument 'path'." } });
    expect(p.stats().tool_calls).toBe(6);
  });

  test("a call with no, an unknown, a released or another lease's sandbox is refused naming the field", async () => {
    const p = provider();
    await post(p, "/sandboxes/create", create("a_0_0~1"), null);
    await post(p, "/sandboxes/create", create("b_0_0~1"), null);
    await post(p, "/sandboxes/release", release("b_0_0~1"), null);
    expect(await post(p, "/tools/sbx_read", call("x:1:0", "sbx_read", { path: "a" }), null)).toEqual({
      status: 400,
      body: {
        error: {
          code: "invalid_input",
          message: "sandbox_id: required: 'sbx_read' runs in a sandbox, so the call must name one (the trajectory needs a sandbox lease: a tools file with a sandbox lifecycle)",
          field: "sandbox_id",
        },
      },
    });
    expect(await post(p, "/tools/sbx_read", call("x:1:1", "sbx_read", { path: "a" }, { sandbox_id: "sbx-99" }), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: no sandbox 'sbx-99'", field: "sandbox_id" } },
    });
    expect(await post(p, "/tools/sbx_write", call("x:1:2", "sbx_write", { path: "a", content: "" }, { sandbox_id: "sbx-2" }), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: sandbox 'sbx-2' was destroyed (its lease was released)", field: "sandbox_id" } },
    });
    expect(await post(p, "/tools/sbx_read", call("x:1:3", "sbx_read", { path: "a" }, { sandbox_id: "sbx-1", lease_id: "b_0_0~1" }), null)).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: "lease_id: sandbox 'sbx-1' belongs to lease 'a_0_0~1', not 'b_0_0~1'", field: "lease_id" } },
    });
    expect(await post(p, "/tools/sbx_exec", call("x:1:4", "sbx_exec", {}, { sandbox_id: "sbx-1" }), null)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "unknown tool 'sbx_exec'; tools: sbx_write, sbx_read" } },
    });
    expect(p.stats().tool_calls).toBe(0);
  });

  test("infra/sandbox/tools.example.json names the two tools at the provider; a signed webhook call with sandbox_id reaches them", async () => {
    const p = provider({ secret: SECRET });
    const text = await Bun.file(new URL("../../infra/sandbox/tools.example.json", import.meta.url)).text();
    const file = parseToolsFile(text, { source: "infra/sandbox/tools.example.json", vars: { port: p.port } });
    expect(file.tools.map((t) => [t.name, t.url])).toEqual([
      ["sbx_write", `${p.url}/tools/sbx_write`],
      ["sbx_read", `${p.url}/tools/sbx_read`],
    ]);
    const { sandbox_id } = SandboxCreateReply.parse((await post(p, "/sandboxes/create", create("w_0_0~1"))).body);
    const target = (i: number) => ({ url: file.tools[i]!.url, secret: SECRET, timeout_ms: 5000, max_retries: 0 });
    const w = await postWebhook(target(0), call("w_0_0:1:0", "sbx_write", { path: "f", content: "42" }, { sandbox_id, lease_id: "w_0_0~1" }));
    const r = await postWebhook(target(1), call("w_0_0:2:0", "sbx_read", { path: "f" }, { sandbox_id, lease_id: "w_0_0~1" }));
    expect([w.status, w.body, r.status, r.body]).toEqual([200, { content: "Wrote 2 bytes to f." }, 200, { content: "42" }]);
  });
});

describe("a per-sandbox OpenEnv environment (openenv: true)", () => {
  test("the create reply carries base_url = {provider}/envs/{sandbox_id}; each sandbox plays its own episode; gone with its sandbox", async () => {
    const p = provider({ openenv: true });
    const a = await post(p, "/sandboxes/create", create("u_0_0~1"), null);
    const b = await post(p, "/sandboxes/create", create("u_1_0~1"), null);
    expect(a).toEqual({ status: 200, body: { sandbox_id: "sbx-1", base_url: `${p.url}/envs/sbx-1` } });
    expect(b.body).toEqual({ sandbox_id: "sbx-2", base_url: `${p.url}/envs/sbx-2` });
    expect(SandboxCreateReply.parse(a.body)).toEqual({ sandbox_id: "sbx-1", base_url: `${p.url}/envs/sbx-1` });
    const envPost = async (url: string, route: string, body: unknown) => {
      const res = await fetch(`${url}/${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      return { status: res.status, body: await res.json() };
    };
    // Two episodes at once, different targets (seed 6 → 7, seed 29 → 30): neither sees the other's state.
    expect((await envPost(`${p.url}/envs/sbx-1`, "reset", { seed: 6, max_attempts: 3 })).body).toEqual({ observation: { prompt: "I picked a number between 1 and 100. You have 3 guesses. Reply with one number.", attempts_left: 3, last_guess: null }, reward: null, done: false });
    await envPost(`${p.url}/envs/sbx-2`, "reset", { seed: 29 });
    expect(await envPost(`${p.url}/envs/sbx-1`, "step", { action: { message: "30" } })).toEqual({ status: 200, body: { observation: { prompt: "Lower. 2 guesses left.", attempts_left: 2, last_guess: 30 }, reward: -0.1, done: false } });
    expect(await envPost(`${p.url}/envs/sbx-2`, "step", { action: { message: "30" } })).toEqual({ status: 200, body: { observation: { prompt: "Correct, it was 30!", attempts_left: 5, last_guess: 30 }, reward: 1, done: true } });
    expect(await (await fetch(`${p.url}/envs/sbx-1/state`)).json()).toEqual({ episode_id: null, step_count: 1 });
    expect(p.stats().env_requests).toEqual({ reset: 2, step: 2, state: 1 });
    expect((await post(p, "/sandboxes/release", release("u_0_0~1", "sbx-1"), null)).status).toBe(200);
    expect(await envPost(`${p.url}/envs/sbx-1`, "step", { action: { message: "7" } })).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: sandbox 'sbx-1' was destroyed (its lease was released)", field: "sandbox_id" } },
    });
  });

  test("without openenv: no base_url, and /envs is 404 naming sandbox_id", async () => {
    const p = provider();
    expect((await post(p, "/sandboxes/create", create("u_0_0~1"), null)).body).toEqual({ sandbox_id: "sbx-1" });
    const res = await fetch(`${p.url}/envs/sbx-1/reset`, { method: "POST", body: "{}" });
    expect({ status: res.status, body: await res.json() }).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "sandbox_id: sandbox 'sbx-1' runs no OpenEnv environment (start the provider with openenv)", field: "sandbox_id" } },
    });
  });

  test("the contract's base_url: an http(s) URL without query or fragment, else refused naming base_url", () => {
    expect(SandboxCreateReply.parse({ sandbox_id: "s", base_url: null })).toEqual({ sandbox_id: "s", base_url: null });
    for (const bad of ["ws://h/x", "http://h/x?q=1", "not a url", 7]) {
      const r = SandboxCreateReply.safeParse({ sandbox_id: "s", base_url: bad });
      expect(r.success).toBe(false);
      expect(r.error!.issues[0]!.path).toEqual(["base_url"]);
    }
  });
});

describe("faults (the lease chaos test's provider)", () => {
  test("create_timeout_fraction: the sandbox exists at once, the reply hangs; a release meanwhile leaves nothing live", async () => {
    const p = provider({ faults: { create_timeout_fraction: 1, hang_ms: 60_000 } });
    const ctl = new AbortController();
    let settled = false;
    const pending = post(p, "/sandboxes/create", create("h_0_0~1"), null, ctl.signal).finally(() => (settled = true));
    pending.catch(() => {});
    await waitFor(() => p.stats().live === 1, "the hung create's sandbox to be live");
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 1, create_timeouts: 1 }));
    expect(settled).toBe(false);
    // edgeloop never heard the sandbox id: it releases by lease id.
    expect(await post(p, "/sandboxes/release", release("h_0_0~1", null, "create_failed"), null)).toEqual({ status: 200, body: { ok: true, sandbox_id: "sbx-1" } });
    expect(countsOf(p)).toEqual(counts({ created: 1, create_timeouts: 1, releases: 1, destroyed_released: 1 }));
    expect(settled).toBe(false);
    ctl.abort();
    expect(await pending.then(() => "answered", (e: Error) => e.name)).toBe("AbortError");
    expect(countsOf(p)).toEqual(counts({ created: 1, create_timeouts: 1, releases: 1, destroyed_released: 1 }));
  });

  test("a held reply ends after hang_ms with the sandbox id, or 409 when the lease was released meanwhile", async () => {
    const p = provider({ faults: { create_timeout_fraction: 1, hang_ms: 300 } });
    expect(await post(p, "/sandboxes/create", create("t_0_0~1"), null)).toEqual({ status: 200, body: { sandbox_id: "sbx-1" } });
    const second = post(p, "/sandboxes/create", create("t_1_0~1"), null);
    await waitFor(() => p.stats().live === 2, "the second create's sandbox");
    await post(p, "/sandboxes/release", release("t_1_0~1"), null);
    expect(await second).toEqual(released("t_1_0~1"));
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 2, create_timeouts: 2, releases: 1, destroyed_released: 1 }));
  });

  test("the timeout draw is deterministic from the seed: exactly the lease ids sandboxFaultDecision picks hang", async () => {
    const faults = { create_timeout_fraction: 0.5, hang_ms: 0, seed: 7 };
    const p = provider({ faults });
    const ids = Array.from({ length: 20 }, (_, i) => `d_${i}_0~1`);
    for (const id of ids) expect((await post(p, "/sandboxes/create", create(id), null)).status).toBe(200);
    const expected = ids.filter((id) => sandboxFaultDecision(0.5, 7, "create", id, 0)).length;
    expect(expected).toBeGreaterThan(0);
    expect(expected).toBeLessThan(20);
    expect(countsOf(p)).toEqual(counts({ live: 20, created: 20, create_timeouts: expected }));
  });

  test("create_delay_ms: a release while the create is in progress cancels it (no sandbox, the create is 409); a duplicate waits for the first", async () => {
    const p = provider({ faults: { create_delay_ms: 400 } });
    const cancelled = post(p, "/sandboxes/create", create("c_0_0~1"), null);
    await waitFor(() => p.stats().creating === 1, "the create to be in progress");
    expect(await post(p, "/sandboxes/release", release("c_0_0~1", null, "create_failed"), null)).toEqual({ status: 200, body: { ok: true, sandbox_id: null } });
    expect(await cancelled).toEqual(released("c_0_0~1"));
    expect(countsOf(p)).toEqual(counts({ releases: 1, cancelled_creates: 1 }));

    const first = post(p, "/sandboxes/create", create("c_1_0~1"), null);
    await waitFor(() => p.stats().creating === 1, "the second create to be in progress");
    const dup = post(p, "/sandboxes/create", create("c_1_0~1"), null);
    expect(await Promise.all([first, dup])).toEqual([
      { status: 200, body: { sandbox_id: "sbx-1" } },
      { status: 200, body: { sandbox_id: "sbx-1" } },
    ]);
    expect(countsOf(p)).toEqual(counts({ live: 1, created: 1, duplicate_creates: 1, releases: 1, cancelled_creates: 1 }));
    expect(p.stats().creates_per_second.reduce((n, s) => n + s.count, 0)).toBe(1);
  });

  test("release_fail_fraction: 500 before anything is done (the sandbox stays, a retry draws again)", async () => {
    const p = provider({ faults: { release_fail_fraction: 1 } });
    await post(p, "/sandboxes/create", create("f_0_0~1"), null);
    expect(await post(p, "/sandboxes/release", release("f_0_0~1"), null)).toEqual({
      status: 500,
      body: { error: { code: "injected_fault", message: "injected release failure (lease 'f_0_0~1')" } },
    });
    expect(await post(p, "/sandboxes/release", release("unknown_0_0~1"), null)).toEqual({
      status: 500,
      body: { error: { code: "injected_fault", message: "injected release failure (lease 'unknown_0_0~1')" } },
    });
    expect(await post(p, "/sandboxes/create", create("f_0_0~1"), null)).toEqual({ status: 200, body: { sandbox_id: "sbx-1" } });
    // The unknown lease was not remembered as released: its create succeeds.
    expect(await post(p, "/sandboxes/create", create("unknown_0_0~1"), null)).toEqual({ status: 200, body: { sandbox_id: "sbx-2" } });
    expect(countsOf(p)).toEqual(counts({ live: 2, created: 2, duplicate_creates: 1, release_faults: 2 }));

    const q = provider({ faults: { release_fail_fraction: 0.5, seed: 3 } });
    await post(q, "/sandboxes/create", create("g_0_0~1"), null);
    const draws = Array.from({ length: 8 }, (_, n) => sandboxFaultDecision(0.5, 3, "release", "g_0_0~1", n));
    const firstOk = draws.indexOf(false);
    expect(firstOk).toBeGreaterThanOrEqual(0);
    for (let n = 0; n < firstOk; n++) expect((await post(q, "/sandboxes/release", release("g_0_0~1"), null)).status).toBe(500);
    expect((await post(q, "/sandboxes/release", release("g_0_0~1"), null)).status).toBe(200);
    expect(countsOf(q)).toEqual(counts({ created: 1, release_faults: firstOk, releases: 1, destroyed_released: 1 }));
  });

  test("a storm of concurrent creates and releases under every fault leaves no sandbox behind; each lease is counted once", async () => {
    const p = provider({ faults: { create_delay_ms: 15, create_timeout_fraction: 0.3, hang_ms: 200, release_fail_fraction: 0.3, seed: 11 } });
    const N = 60;
    const statuses: number[] = [];
    await Promise.all(
      Array.from({ length: N }, async (_, i) => {
        const lease = `storm_${i}_0~1`;
        // The client's create deadline is shorter than hang_ms; the release is sent early, late or at once.
        const created = post(p, "/sandboxes/create", create(lease), null, AbortSignal.timeout(60)).catch(() => null);
        if (i % 3 === 1) await created;
        if (i % 3 === 2) await waitFor(() => p.stats().creating > 0 || p.stats().live > 0, "a create under way");
        for (;;) {
          const r = await post(p, "/sandboxes/release", release(lease, null, "create_failed"), null);
          if (r.status !== 500) {
            statuses.push(r.status);
            break;
          }
        }
        await created;
      }),
    );
    const s = p.stats();
    expect(s.live).toBe(0);
    expect(s.creating).toBe(0);
    expect(s.created).toBe(s.destroyed_released);
    expect(s.destroyed_expired).toBe(0);
    expect(s.created + s.refused_released + s.cancelled_creates).toBe(N);
    expect(s.releases + s.release_not_found).toBe(N);
    expect(statuses.filter((x) => x === 200).length).toBe(s.releases);
    expect(s.release_faults).toBeGreaterThan(0);
  });

  test("bad faults are refused at start, naming the field", () => {
    expect(() => startSandboxProvider({ faults: { create_timeout_fraction: 2 } })).toThrow(new ConfigError("faults.create_timeout_fraction", "Too big: expected number to be <=1"));
    expect(() => startSandboxProvider({ faults: { hang: 5 } as never })).toThrow(ConfigError);
  });
});

describe("the create rate stats", () => {
  test("peak_creates_1s is the most creations in any half-open 1000 ms window; creates_per_second counts each second", async () => {
    const T0 = 1_700_000_000_000;
    let clock = T0;
    const p = provider({ now: () => clock });
    // A scripted burst: offsets in ms. Windows: [400, 1400) holds 5 (a closed window [400, 1400] would hold 6).
    const offsets = [0, 400, 999, 1000, 1200, 1300, 1400, 1999, 2000, 2500];
    for (const [i, off] of offsets.entries()) {
      clock = T0 + off;
      expect((await post(p, "/sandboxes/create", create(`r_${i}_0~1`), null)).status).toBe(200);
      // Duplicates, refused and cancelled creates make no sandbox and are not counted.
      await post(p, "/sandboxes/create", create(`r_${i}_0~1`), null);
    }
    await post(p, "/sandboxes/release", release("r_gone_0~1"), null);
    await post(p, "/sandboxes/create", create("r_gone_0~1"), null);
    const s = p.stats();
    expect(s.created).toBe(10);
    expect(s.peak_creates_1s).toBe(5);
    expect(s.creates_per_second).toEqual([
      { second: 1_700_000_000, count: 3 },
      { second: 1_700_000_001, count: 5 },
      { second: 1_700_000_002, count: 2 },
    ]);
    const wire = (await (await fetch(`${p.url}/stats`)).json()) as SandboxProviderStats;
    expect(wire).toEqual(s);
  });

  test("no creations: peak 0 and an empty histogram", () => {
    const p = provider();
    expect([p.stats().peak_creates_1s, p.stats().creates_per_second]).toEqual([0, []]);
  });
});
