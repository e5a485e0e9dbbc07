import { describe, expect, test } from "bun:test";
import { REPLICA_HEADER, type Gateway } from "../../functions/gateway.ts";
import { EngineUnavailableError } from "../../shared/errors.ts";
import { RetryingClient, VllmClient, type GenerateRequest } from "../../shared/inference/index.ts";
import type { ReplicaStatus } from "../../shared/inference/replica-pool.ts";
import { SamplingParams, type TokenOutput } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createSimEngineApp, SimEngine, SimEngineClient } from "../../infra/sim-engine/index.ts";
import { gatewayTestbed } from "../helpers/gateway-testbed.ts";
import { waitFor } from "../helpers/wait.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E8 (edge-cases.md), in-process gateway over real loopback replicas: a replica
// that hangs, one that answers 200 with garbage, ejection, re-pins, half-open
// recovery. Timeouts are scaled down (E8 uses engine.timeout_ms 3000).
const SCRIPT = { seed: 5, rules: [], default: ["Let me think.", "Still thinking.", "Done. #### 4"] };
const sp = SamplingParams.parse({});

type Mode = "ok" | "hang" | "garbage" | "wrong_json";

/** A replica whose behaviour can be switched: a real simulated engine, or hung, or answering 200 with garbage. */
interface ToggleReplica {
  url: string;
  mode: Mode;
  /** Generate calls seen per routing key (every mode). */
  calls: Map<string, number>;
  stop(): void;
}

function toggleReplica(tok: ChatTokenizer): ToggleReplica {
  const app = createSimEngineApp(new SimEngine({ tokenizer: tok, script: SCRIPT, name: "toggle" }));
  const r: ToggleReplica = { url: "", mode: "ok", calls: new Map(), stop: () => server.stop(true) };
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 0,
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/health") return new Response(null, { status: 200 });
      const key = req.headers.get("x-session-id") ?? "";
      r.calls.set(key, (r.calls.get(key) ?? 0) + 1);
      if (r.mode === "hang") return new Promise<Response>(() => {});
      if (r.mode === "garbage") return new Response("<html><body>502 upstream exploded</body></html>", { status: 200, headers: { "content-type": "text/html" } });
      if (r.mode === "wrong_json") return Response.json({ ok: true, note: "not a completion" });
      return app.fetch(req);
    },
  });
  r.url = `http://127.0.0.1:${server.port}`;
  return r;
}

const bed = gatewayTestbed({ script: SCRIPT, replicas: 2, gateway: { adminToken: "test-admin-token" }, idleTimeout: 0 });
const { cleanups, serveGateway } = bed;

/** One turn's prompt for trajectory `key` after `outputs`. */
function promptFor(key: string, outputs: TokenOutput[]): number[] {
  let p = bed.tok.encode(`<|im_start|>user\n[${key}] What is 2+2?<|im_end|>\n<|im_start|>assistant\n`);
  for (const o of outputs) p = [...p, ...o.token_ids, ...bed.tok.encode("\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n")];
  return p;
}

/** Runs turn `t` of every trajectory concurrently; returns each trajectory's served-by replica. */
async function turn(generate: (r: GenerateRequest) => Promise<TokenOutput>, keys: string[], outs: Map<string, TokenOutput[]>): Promise<void> {
  await Promise.all(
    keys.map(async (key) => {
      const prev = outs.get(key) ?? [];
      const out = await generate({ request_id: crypto.randomUUID(), routing_key: key, prompt_ids: promptFor(key, prev), sampling_params: sp, max_tokens: 64 });
      outs.set(key, [...prev, out]);
    }),
  );
}

/** The same turns on a fresh in-process engine: what every trajectory must hold whatever replica served it. */
async function reference(keys: string[], turns: number): Promise<Map<string, TokenOutput[]>> {
  const ref = new SimEngineClient(new SimEngine({ tokenizer: bed.tok, script: SCRIPT }));
  const outs = new Map<string, TokenOutput[]>();
  for (let t = 0; t < turns; t++) await turn((r) => ref.generate(r), keys, outs);
  return outs;
}

const strip = (outs: Map<string, TokenOutput[]>) =>
  [...outs].sort(([x], [y]) => (x < y ? -1 : 1)).map(([k, os]) => [k, os.map((o) => [o.token_ids, o.log_probs, o.finish_reason])]);
const statusOf = (gw: Gateway, url: string): ReplicaStatus => gw.replicas().find((r) => r.url === url)!;

describe("E8: sessions pinned to a replica that starts hanging", () => {
  test("21 trajectories, least_inflight_sticky: A hangs after turn 1 → per-attempt timeouts, A ejected, every key pinned to A re-pinned (counted), no trajectory fails", async () => {
    const a = toggleReplica(bed.tok);
    cleanups.push(() => a.stop());
    const { gw, url } = serveGateway([a.url, ...bed.sim.urls], { policy: "least_inflight_sticky", attemptTimeoutMs: 1_000, ejectAfter: 3, cooldownMs: 60_000 });
    const client = new RetryingClient(new VllmClient({ url, timeoutMs: 3_000 }), { retries: 3, minDelayMs: 10 });
    const keys = Array.from({ length: 21 }, (_, i) => `e8-sticky-${i}`);
    const outs = new Map<string, TokenOutput[]>();
    await turn((r) => client.generate(r), keys, outs);
    const pinnedToA = keys.filter((k) => outs.get(k)![0]!.extra_fields.replica === a.url);
    expect(pinnedToA.length).toBeGreaterThanOrEqual(3);
    a.mode = "hang";
    await turn((r) => client.generate(r), keys, outs);
    await turn((r) => client.generate(r), keys, outs);
    expect(strip(outs)).toEqual(strip(await reference(keys, 3)));
    // Turns 2 and 3 of A's keys were served elsewhere, by one replica each (re-pinned, then sticky).
    for (const k of pinnedToA) {
      const [, t2, t3] = outs.get(k)!.map((o) => o.extra_fields.replica);
      expect(t2).not.toBe(a.url);
      expect(t3).toBe(t2);
    }
    const s = statusOf(gw, a.url);
    expect(s).toMatchObject({ healthy: false, state: "ejected", ejections: 1, inflight: 0 });
    // Every key pinned to A timed out there exactly once (turn 2), then never came back.
    expect(s.failures_by_kind).toEqual({ timeout: pinnedToA.length, client_abort: 0, connect: 0, http_5xx: 0, bad_reply: 0 });
    // Turn 1 served there, turn 2 timed out there: two attempts per key, one served.
    expect([s.attempts, s.served]).toEqual([2 * pinnedToA.length, pinnedToA.length]);
    // The first two failed over while A was still in rotation; the third ejected it.
    expect(s.repins_by_reason).toEqual({ failover: 2, unhealthy: pinnedToA.length - 2, load: 0 });
    expect(s.repins).toBe(pinnedToA.length);
    const admin = await (await fetch(`${url}/admin/replicas`, { headers: { authorization: "Bearer test-admin-token" } })).json();
    expect(admin.repins).toBe(pinnedToA.length);
    expect(admin.breaker).toEqual({ eject_after: 3, cooldown_ms: 60_000, attempt_timeout_ms: 1_000 });
    expect(admin.replicas[0]).toMatchObject({ url: a.url, healthy: false, state: "ejected" });
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain(`edgeloop_gateway_replica_healthy{replica="${a.url}"} 0`);
    expect(metrics).toContain(`edgeloop_gateway_replica_state{replica="${a.url}",state="ejected"} 1`);
    expect(metrics).toContain(`edgeloop_gateway_failures_total{replica="${a.url}",kind="timeout"} ${pinnedToA.length}`);
    expect(metrics).toContain(`edgeloop_gateway_ejections_total{replica="${a.url}"} 1`);
    expect(metrics).toContain(`edgeloop_gateway_requests_total{replica="${a.url}"} ${2 * pinnedToA.length}`);
    expect(metrics).toContain(`edgeloop_gateway_served_total{replica="${a.url}"} ${pinnedToA.length}`);
    expect(metrics).toContain(`edgeloop_gateway_repins_total{replica="${a.url}",reason="unhealthy"} ${pinnedToA.length - 2}`);
    expect(metrics).toContain(`edgeloop_gateway_repins_total{replica="${a.url}",reason="failover"} 2`);
  }, HANG_MS);

  test("bounded_load_hash: keys whose first choice is the hung replica move to their next choice (counted) and stay there", async () => {
    const a = toggleReplica(bed.tok);
    cleanups.push(() => a.stop());
    const { gw, url } = serveGateway([a.url, ...bed.sim.urls], { policy: "bounded_load_hash", attemptTimeoutMs: 1_000, cooldownMs: 60_000 });
    const client = new RetryingClient(new VllmClient({ url, timeoutMs: 3_000 }), { retries: 3, minDelayMs: 10 });
    const keys = Array.from({ length: 24 }, (_, i) => `e8-hash-${i}`);
    const outs = new Map<string, TokenOutput[]>();
    await turn((r) => client.generate(r), keys, outs);
    const onA = keys.filter((k) => outs.get(k)![0]!.extra_fields.replica === a.url);
    expect(onA.length).toBeGreaterThanOrEqual(3);
    a.mode = "hang";
    await turn((r) => client.generate(r), keys, outs);
    await turn((r) => client.generate(r), keys, outs);
    expect(strip(outs)).toEqual(strip(await reference(keys, 3)));
    const s = statusOf(gw, a.url);
    expect(s).toMatchObject({ state: "ejected" });
    // Every key that timed out there moved (one repin per failure). Under load, bounded_load may also have placed a
    // key there in turn 2 (its first choice over the load bound): it timed out once and moved like the others.
    expect(s.repins).toBe(s.failures);
    expect(s.failures).toBeGreaterThanOrEqual(onA.length);
    expect(s.failures).toBeLessThanOrEqual(onA.length + 2);
    for (const k of onA) expect(a.calls.get(k)).toBe(2);
  }, HANG_MS);
});

describe("E8: a replica answering 200 with garbage", () => {
  for (const mode of ["garbage", "wrong_json"] as const) {
    test(`${mode}: each garbled reply is a bad_reply failure, retried on another replica; A is ejected; no trajectory fails`, async () => {
      const a = toggleReplica(bed.tok);
      a.mode = mode;
      cleanups.push(() => a.stop());
      const { gw, url } = serveGateway([a.url, ...bed.sim.urls], { policy: "least_inflight_sticky", cooldownMs: 60_000 });
      // No retries in the client: the gateway's own failover must hide the garbage.
      const client = new VllmClient({ url, timeoutMs: 3_000 });
      const keys = Array.from({ length: 21 }, (_, i) => `e8-${mode}-${i}`);
      const outs = new Map<string, TokenOutput[]>();
      for (let t = 0; t < 2; t++) await turn((r) => client.generate(r), keys, outs);
      expect(strip(outs)).toEqual(strip(await reference(keys, 2)));
      for (const os of outs.values()) for (const o of os) expect(bed.sim.urls).toContain(o.extra_fields.replica as string);
      const s = statusOf(gw, a.url);
      expect(s).toMatchObject({ healthy: false, state: "ejected", ejections: 1 });
      expect(s.failures_by_kind.bad_reply).toBe(s.attempts);
      expect(s.served).toBe(0);
      expect(s.failures_by_kind.bad_reply).toBeGreaterThanOrEqual(3);
      // A health check that passes (A answers /health) does not bring an ejected replica back.
      await gw.checkHealth();
      expect(statusOf(gw, a.url).state).toBe("ejected");
    });
  }

  test("every replica garbled: 502 bad_reply naming the problem, which the client retries as unavailable", async () => {
    const a = toggleReplica(bed.tok);
    a.mode = "garbage";
    cleanups.push(() => a.stop());
    const { url } = serveGateway([a.url], { ejectAfter: 5 });
    const res = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: [1, 2], max_tokens: 2 }), headers: { "x-session-id": "g" } });
    expect(res.status).toBe(502);
    expect(res.headers.get(REPLICA_HEADER)).toBe(a.url);
    const body = await res.json();
    expect(body.error.code).toBe("bad_reply");
    expect(body.error.message).toBe(`engine replica sent an unusable reply: ${a.url}: body is not JSON ("<html><body>502 upstream exploded</body></html>")`);
    const e = await new VllmClient({ url }).generate({ request_id: "g1", routing_key: "g", prompt_ids: [1, 2], sampling_params: sp, max_tokens: 2 }).catch((x) => x);
    expect(e).toBeInstanceOf(EngineUnavailableError);
    expect((e as EngineUnavailableError).retryable).toBe(true);
  });

  test("directly against a garbling engine (no gateway), the client retries the garbled 2xx", async () => {
    const a = toggleReplica(bed.tok);
    a.mode = "garbage";
    cleanups.push(() => a.stop());
    let n = 0;
    const inner = new VllmClient({ url: a.url, timeoutMs: 2_000 });
    const client = new RetryingClient(
      {
        generate: (r) => {
          if (++n === 3) a.mode = "ok";
          return inner.generate(r);
        },
      },
      { retries: 3, minDelayMs: 1 },
    );
    const out = await client.generate({ request_id: "d1", routing_key: "direct", prompt_ids: promptFor("direct", []), sampling_params: sp, max_tokens: 64 });
    expect(out.token_ids).toEqual([...bed.tok.encode("Let me think."), 151645]);
    expect(a.calls.get("direct")).toBe(3);
  });
});

describe("E8: half-open recovery and client aborts", () => {
  test("after the cool-down one call probes A: a failed probe re-ejects it, a good one restores it", async () => {
    let now = 1_000_000;
    const a = toggleReplica(bed.tok);
    a.mode = "garbage";
    cleanups.push(() => a.stop());
    const { gw, url } = serveGateway([a.url, bed.sim.urls[0]!], { policy: "least_inflight_sticky", ejectAfter: 3, cooldownMs: 5_000, now: () => now });
    const call = async (key: string) => {
      const res = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: promptFor(key, []), max_tokens: 8 }), headers: { "x-session-id": key } });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      return res.headers.get(REPLICA_HEADER);
    };
    // Calls land on A (least in-flight, insertion order) until it is ejected.
    for (let i = 0; i < 3; i++) expect(await call(`h${i}`)).toBe(bed.sim.urls[0]!);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", attempts: 3, served: 0, ejected_until_ms: 1_005_000 });
    now += 4_999;
    await call("h-cool");
    expect(statusOf(gw, a.url).attempts).toBe(3);
    // Cool-down over, A still broken: exactly one call probes it, fails, and is served elsewhere.
    now += 1;
    expect(await call("h-probe1")).toBe(bed.sim.urls[0]!);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", attempts: 4, served: 0, probes: 1, probes_ok: 0, probes_failed: 1, ejections: 2, ejected_until_ms: 1_010_000 });
    // A recovers; the next probe restores it, and new keys reach it again.
    a.mode = "ok";
    now += 5_000;
    expect(await call("h-probe2")).toBe(a.url);
    expect(statusOf(gw, a.url)).toMatchObject({ healthy: true, state: "healthy", attempts: 5, served: 1, probes: 2, probes_ok: 1, probes_failed: 1, consecutive_failures: 0, ejected_until_ms: null });
    expect(await call("h-new")).toBe(a.url);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain(`edgeloop_gateway_probes_total{replica="${a.url}",result="ok"} 1`);
    expect(metrics).toContain(`edgeloop_gateway_probes_total{replica="${a.url}",result="failed"} 1`);
  });

  test("only one probe at a time: concurrent calls after the cool-down send one to a hung A", async () => {
    // (A generous attempt timeout: B must never hit it on a loaded machine.)
    let now = 0;
    const a = toggleReplica(bed.tok);
    a.mode = "hang";
    cleanups.push(() => a.stop());
    const { gw, url } = serveGateway([a.url, bed.sim.urls[0]!], { ejectAfter: 1, cooldownMs: 1_000, attemptTimeoutMs: 1_000, now: () => now });
    const call = (key: string) =>
      fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: promptFor(key, []), max_tokens: 8 }), headers: { "x-session-id": key } }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      });
    expect(await call("p0")).toBe(200);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", failures_by_kind: { timeout: 1 } });
    now += 1_000;
    expect(await Promise.all(["p1", "p2", "p3", "p4"].map(call))).toEqual([200, 200, 200, 200]);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", attempts: 2, served: 0, probes: 1, probes_failed: 1 });
  });

  test("a caller that aborts before its declared deadline costs the replica nothing; at its deadline it is a client_abort failure", async () => {
    const a = toggleReplica(bed.tok);
    a.mode = "hang";
    cleanups.push(() => a.stop());
    const { gw, url } = serveGateway([a.url], { ejectAfter: 2, cooldownMs: 60_000 });
    const body = JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2 });
    // The trainer cancels early (its deadline is 10 s away): not A's fault.
    const early = await fetch(`${url}/v1/completions`, { method: "POST", body, headers: { "x-session-id": "c", "x-edgeloop-timeout-ms": "10000" }, signal: AbortSignal.timeout(150) }).catch((e) => e);
    expect((early as Error).name).toBe("TimeoutError");
    await waitFor(() => statusOf(gw, a.url).inflight === 0, "the aborted call to leave A");
    expect(statusOf(gw, a.url)).toMatchObject({ state: "healthy", failures: 0, consecutive_failures: 0, inflight: 0 });
    // The engine client gives up at its own deadline (declared in x-edgeloop-timeout-ms): A's failure.
    for (let i = 0; i < 2; i++) {
      const e = await new VllmClient({ url, timeoutMs: 300 })
        .generate({ request_id: `c${i}`, routing_key: "c", prompt_ids: [1, 2, 3], sampling_params: sp, max_tokens: 2 })
        .catch((x) => x);
      expect((e as Error).name).toBe("EngineUnavailableError");
    }
    await waitFor(() => statusOf(gw, a.url).inflight === 0 && statusOf(gw, a.url).failures_by_kind.client_abort === 2, "both timed-out calls to be counted");
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", failures_by_kind: { client_abort: 2 }, inflight: 0 });
  });
});
