import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { allowAnonymous } from "../../functions/http-util.ts";
import { requireRedis } from "../helpers/redis.ts";
import { startServices, startWorkerd, workerBindings, type Services, type Workerd } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// S8 (security audit): the Worker fails closed. Without EDGELOOP_API_TOKEN it refuses /v1/* (403
// auth_not_configured) unless EDGELOOP_ALLOW_ANONYMOUS=1 is set, and it logs its auth state (on an
// isolate's first request: a Worker has no start) as `serve` prints its own. Run in workerd (Miniflare).
const redis = await requireRedis();
let s: Services;
const started: Workerd[] = [];

/** A Worker with `bindings` over the services (no EDGELOOP_ALLOW_ANONYMOUS unless given) and its captured console output. */
async function worker(extra: Record<string, string>): Promise<{ w: Workerd; logged: (text: string) => Promise<string> }> {
  const { EDGELOOP_ALLOW_ANONYMOUS: _, ...base } = workerBindings(s);
  let out = "";
  const waiters: (() => void)[] = [];
  const w = await startWorkerd({ ...base, ...extra }, undefined, {
    stdio: (stdout, stderr) => {
      for (const st of [stdout, stderr])
        st.on("data", (d: Buffer) => {
          out += d.toString();
          for (const wake of waiters.splice(0)) wake();
        });
    },
  });
  started.push(w);
  /** The output once it holds `text` (console output arrives on a pipe, after the response). */
  const logged = async (text: string): Promise<string> => {
    while (!out.includes(text)) await new Promise<void>((r) => waiters.push(r));
    return out;
  };
  return { w, logged };
}

beforeAll(async () => {
  if (!redis) return;
  s = await startServices("workerd-auth");
}, HANG_MS);

afterAll(async () => {
  for (const w of started) await w.stop();
  await s?.stop();
});

const REFUSED = {
  error: {
    code: "auth_not_configured",
    message: "this Worker has no EDGELOOP_API_TOKEN, so /v1/* is refused: set EDGELOOP_API_TOKEN (a secret), or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth",
  },
};
const ROW = { rows: [{ prompt: [{ role: "user", content: "What is 2+2?" }] }] };
const post = (headers: Record<string, string> = {}) => ({ method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(ROW) });

describe.skipIf(!redis)("S8: the Worker without EDGELOOP_API_TOKEN", () => {
  test("refuses /v1/rollouts and /v1/groups with 403 auth_not_configured; /health still answers; the state is logged", async () => {
    const { w, logged } = await worker({});
    const r = await w.mf.dispatchFetch("http://localhost/v1/rollouts", post());
    expect([r.status, await r.json()]).toEqual([403, REFUSED]);
    const g = await w.mf.dispatchFetch("http://localhost/v1/groups/abc");
    expect([g.status, await g.json()]).toEqual([403, REFUSED]);
    // A bearer token does not help: there is none to check it against.
    const t = await w.mf.dispatchFetch("http://localhost/v1/rollouts", post({ authorization: "Bearer guess" }));
    expect(t.status).toBe(403);
    expect((await w.mf.dispatchFetch("http://localhost/health")).status).toBe(200);
    expect(await logged("auth_not_configured")).toContain(
      "edgeloop (workerd) auth       no EDGELOOP_API_TOKEN: /v1/* is refused (403 auth_not_configured); set EDGELOOP_API_TOKEN, or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth",
    );
  }, HANG_MS);

  test("EDGELOOP_ALLOW_ANONYMOUS=1 serves /v1/* without a token, said in the log; yes or 0 do not opt out", async () => {
    const { w, logged } = await worker({ EDGELOOP_ALLOW_ANONYMOUS: "1" });
    const r = await w.mf.dispatchFetch("http://localhost/v1/rollouts", post());
    expect(r.status).toBe(202);
    await r.arrayBuffer();
    expect(await logged("ALLOW_ANONYMOUS=1)")).toContain(
      "edgeloop (workerd) auth       NONE (EDGELOOP_ALLOW_ANONYMOUS=1): anyone who reaches this URL can submit batches and read group status",
    );
    // Only "1" or "true" opt out (the value the Worker reads; a typo stays refused).
    expect(["1", "true", "yes", "0", "", undefined].map(allowAnonymous)).toEqual([true, true, false, false, false, false]);
  }, HANG_MS);
});

describe.skipIf(!redis)("S8: the Worker with EDGELOOP_API_TOKEN", () => {
  test("401 without or with a wrong bearer token, served with it; the log says a token is required", async () => {
    const { w, logged } = await worker({ EDGELOOP_API_TOKEN: "worker-token-1" });
    const none = await w.mf.dispatchFetch("http://localhost/v1/groups/abc");
    expect([none.status, await none.json()]).toEqual([401, { error: { code: "unauthorized", message: "missing or wrong bearer token" } }]);
    expect((await w.mf.dispatchFetch("http://localhost/v1/groups/abc", { headers: { authorization: "Bearer worker-token-2" } })).status).toBe(401);
    const ok = await w.mf.dispatchFetch("http://localhost/v1/groups/abc", { headers: { authorization: "Bearer worker-token-1" } });
    expect(ok.status).toBe(200);
    await ok.arrayBuffer();
    expect(await logged("bearer token required")).toContain("edgeloop (workerd) auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)");
    expect(await logged("bearer token required")).not.toContain("worker-token-1");
  }, HANG_MS);
});

describe.skipIf(!redis)("S20: the Worker warns when agent tasks go unsigned", () => {
  test("EDGELOOP_AGENT_URL without EDGELOOP_AGENT_SECRET: the warning after the auth state on the isolate's first request", async () => {
    const { w, logged } = await worker({ EDGELOOP_API_TOKEN: "worker-token-1", EDGELOOP_AGENT_URL: "http://127.0.0.1:9/tasks" });
    for (let i = 0; i < 3; i++) await (await w.mf.dispatchFetch("http://localhost/health")).arrayBuffer();
    const out = await logged("agent tasks are sent unsigned");
    expect(out).toContain("edgeloop (workerd) auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)");
    expect(out).toContain(
      "edgeloop (workerd) warning    agent tasks are sent unsigned (no EDGELOOP_AGENT_SECRET): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set EDGELOOP_AGENT_SECRET (a secret; the agent must verify x-edgeloop-signature with it)",
    );
  }, HANG_MS);
});
