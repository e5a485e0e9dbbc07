import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { VllmClient } from "../../shared/inference/vllm-client.ts";
import { prefixKeyOf } from "../../shared/inference/prefix-key.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { spawnCli, until, type CliProc } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 17 items 1–3 with real processes: `edgeloop gateway` instances over one Redis (and one over
// Upstash REST through the bridge) in front of three sim replicas.
const SCRIPT = { seed: 5, rules: [], default: ["Done here.", "Still done."] };
const LEASE_TTL_MS = 1_500;
const hasRedis = await requireRedis();

let tok: ChatTokenizer;
let sim: RunningSimEngine;
let bridge: UpstashBridge;
const prefix = randomPrefix("shared-gw");
const token = `tok-${crypto.randomUUID()}`;
const gateways: (CliProc & { url: string })[] = [];
let raw: ReturnType<typeof rawRedis>;

async function spawnGateway(args: string[], env: Record<string, string> = {}): Promise<CliProc & { url: string }> {
  const p = spawnCli(["gateway", "--port", "0", "--replicas", sim.urls.join(","), "--store-prefix", prefix, ...args], { EDGELOOP_ADMIN_TOKEN: "test-admin-token", ...env });
  const deadline = Date.now() + 60_000; // a bound for a hang only (start-up takes seconds; longer on a loaded machine)
  for (;;) {
    const m = /edgeloop gateway on (http:\/\/[^\s]+)/.exec(p.out());
    if (m) {
      const g = { ...p, url: m[1]! };
      gateways.push(g);
      return g;
    }
    if (p.proc.exitCode !== null || Date.now() > deadline) throw new Error(`gateway did not start: ${p.err()}`);
    await Bun.sleep(50);
  }
}

const sp = SamplingParams.parse({ stop_token_ids: [151645] });
const SYSTEM = "You are a careful assistant. Answer in one short sentence. ".repeat(6);

function firstPrompt(i: number): number[] {
  return tok.renderIds(
    [
      { role: "system", content: SYSTEM },
      { role: "user", content: `Session ${i}: say something.` },
    ] as never,
    { addGenerationPrompt: true },
  );
}

/** Runs `turns` turns of session `key`, turn t through `urls[(start + t) % urls.length]`; `withPrefix`: send the prompt's prefix key. */
async function session(urls: string[], key: string, i: number, turns: number, start: number, withPrefix = true): Promise<string[]> {
  let prompt = firstPrompt(i);
  const served: string[] = [];
  for (let t = 0; t < turns; t++) {
    const client = new VllmClient({ url: urls[(start + t) % urls.length]! });
    const out = await client.generate({ request_id: crypto.randomUUID(), routing_key: key, ...(withPrefix ? { prefix_key: prefixKeyOf(prompt, tok.turnEndIds) } : {}), prompt_ids: prompt, sampling_params: sp, max_tokens: 32 });
    prompt = [...prompt, ...out.token_ids, ...tok.encode("\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n")];
    served.push(key);
  }
  return served;
}

/** Replica index → routing keys in its request log. */
function keysByReplica(): Map<string, Set<number>> {
  const out = new Map<string, Set<number>>();
  sim.replicas.forEach((r, idx) => {
    for (const l of r.engine.requests) {
      if (!l.routing_key) continue;
      let s = out.get(l.routing_key);
      if (!s) out.set(l.routing_key, (s = new Set()));
      s.add(idx);
    }
  });
  return out;
}

/** Live leases per replica, read from Redis directly (ZCOUNT over scores after now). */
async function liveLeases(): Promise<number[]> {
  const now = Date.now();
  return Promise.all(sim.urls.map((u) => raw.zcount(`${prefix}routing:leases:${u}`, `(${now}`, "+inf")));
}

describe.skipIf(!hasRedis)("two `edgeloop gateway` processes sharing routing state in Redis", () => {
  let cfgPath: string;
  beforeAll(async () => {
    tok = await defaultTokenizer();
    sim = await startSimEngine({ replicas: 3, script: SCRIPT, tokenizer: tok });
    bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
    raw = rawRedis();
    const dir = mkdtempSync(join(tmpdir(), "shared-gw-"));
    cfgPath = join(dir, "gateway.json");
    writeFileSync(cfgPath, JSON.stringify({ gateway: { lease_ttl_ms: LEASE_TTL_MS, eject_after: 1, cooldown_ms: 120_000, attempt_timeout_ms: 20_000 } }));
    await spawnGateway(["--store", REDIS_URL, "--config", cfgPath]);
    await spawnGateway(["--store", REDIS_URL, "--config", cfgPath]);
  }, HANG_MS);
  afterAll(async () => {
    for (const g of gateways) g.proc.kill("SIGKILL");
    for (const r of sim?.replicas ?? []) r.engine.resume();
    await sim?.stop();
    await bridge?.stop();
    await raw?.quit();
    await deleteByPrefix(prefix);
  });

  test("every session's turns hit one replica, though its turns alternate between the two instances", async () => {
    const [g1, g2] = gateways;
    expect(g1!.out()).toContain(`routing state shared in ${REDIS_URL}`);
    await Promise.all(Array.from({ length: 24 }, (_, i) => session([g1!.url, g2!.url], `s${i}_0_0`, i, 3, i)));
    const byKey = keysByReplica();
    for (let i = 0; i < 24; i++) expect([`s${i}_0_0`, byKey.get(`s${i}_0_0`)?.size]).toEqual([`s${i}_0_0`, 1]);
    const calls = sim.replicas.map((r) => r.engine.requests.filter((l) => l.routing_key?.startsWith("s")).length);
    expect(calls.reduce((a, b) => a + b, 0)).toBe(72);
    // Every lease was released.
    await until(async () => (await liveLeases()).every((n) => n === 0), "leases released", HANG_MS);
    // Each pin in Redis names the replica that served the session.
    for (let i = 0; i < 24; i += 5) {
      const idx = [...byKey.get(`s${i}_0_0`)!][0]!;
      expect(await raw.get(`${prefix}routing:pin:s${i}_0_0`)).toBe(sim.urls[idx]!);
    }
  }, HANG_MS);

  test("control: two instances with --no-shared-state split sessions between replicas", async () => {
    const p1 = await spawnGateway(["--store", REDIS_URL, "--no-shared-state"]);
    const p2 = await spawnGateway(["--store", REDIS_URL, "--no-shared-state"]);
    expect(p1.out()).toContain("(least_inflight_sticky, 10000 sticky keys;");
    await Promise.all(Array.from({ length: 24 }, (_, i) => session([p1.url, p2.url], `c${i}_0_0`, 500 + i, 3, i)));
    const byKey = keysByReplica();
    const split = Array.from({ length: 24 }, (_, i) => byKey.get(`c${i}_0_0`)!.size).filter((n) => n > 1).length;
    expect(split).toBeGreaterThan(0);
    expect(await raw.exists(`${prefix}routing:pin:c0_0_0`)).toBe(0);
    p1.proc.kill("SIGKILL");
    p2.proc.kill("SIGKILL");
  }, HANG_MS);

  test("the Upstash REST path (through the bridge) shares the same pins", async () => {
    const g3 = await spawnGateway(["--store", "upstash", "--config", cfgPath], { UPSTASH_REDIS_REST_URL: bridge.url, UPSTASH_REDIS_REST_TOKEN: token });
    expect(g3.out()).toContain("routing state shared in upstash");
    const before = keysByReplica();
    // Sessions s0..s9 were pinned by the TCP instances: their next turns through Upstash stay.
    await Promise.all(Array.from({ length: 10 }, (_, i) => session([g3.url, gateways[1]!.url], `s${i}_0_0`, i, 2, 0)));
    const after = keysByReplica();
    for (let i = 0; i < 10; i++) expect([...after.get(`s${i}_0_0`)!]).toEqual([...before.get(`s${i}_0_0`)!]);
    // A release is folded into a later script or sent releaseFoldMs after its call: kill g3 only once every
    // lease is gone, or its last leases live on for the lease TTL into the next test's counts.
    await until(async () => (await liveLeases()).every((n) => n === 0), "upstash leases released", HANG_MS);
    g3.proc.kill("SIGKILL");
  }, HANG_MS);

  test("SIGKILL of an instance with calls in flight: its leases expire after the lease TTL, then load evens out", async () => {
    const [g1, g2] = gateways;
    await until(async () => (await liveLeases()).every((n) => n === 0), "no lease left from earlier tests", HANG_MS);
    for (const r of sim.replicas) await r.engine.pause("keep");
    try {
      // Six calls held in flight through g1: bounded load spreads them 2/2/2.
      const held = Array.from({ length: 6 }, (_, i) => session([g1!.url], `k${i}_0_0`, 100 + i, 1, 0).catch(() => null));
      await until(async () => (await liveLeases()).reduce((a, b) => a + b, 0) === 6, "six leases", HANG_MS, 20);
      expect(await liveLeases()).toEqual([2, 2, 2]);
      g1!.proc.kill("SIGKILL");
      await g1!.proc.exited;
      const killedAt = Date.now();
      expect((await liveLeases()).reduce((a, b) => a + b, 0)).toBe(6);
      // Each lease's score is its expiry: none outlives the kill by more than the lease TTL.
      const expiries = (await Promise.all(sim.urls.map((u) => raw.zrange(`${prefix}routing:leases:${u}`, "0", "-1", "WITHSCORES")))).flatMap((r) => r.filter((_, k) => k % 2 === 1).map(Number));
      expect(expiries.length).toBe(6);
      expect(Math.max(...expiries)).toBeLessThanOrEqual(killedAt + LEASE_TTL_MS);
      await until(async () => (await liveLeases()).every((n) => n === 0), "dead leases expired", HANG_MS, 50);
      await Promise.all(held);
      // The survivor now routes six new calls over an even, empty load.
      const fresh = Array.from({ length: 6 }, (_, i) => session([g2!.url], `f${i}_0_0`, 200 + i, 1, 0));
      await until(async () => (await liveLeases()).reduce((a, b) => a + b, 0) === 6, "six fresh leases", HANG_MS, 20);
      expect(await liveLeases()).toEqual([2, 2, 2]);
      for (const r of sim.replicas) r.engine.resume();
      await Promise.all(fresh);
      await until(async () => (await liveLeases()).every((n) => n === 0), "fresh leases released", HANG_MS);
    } finally {
      // A failure above must not leave the replicas paused for the tests after it.
      for (const r of sim.replicas) r.engine.resume();
    }
  }, HANG_MS);

  test("a replica ejected through one instance is avoided by the other", async () => {
    const g2 = gateways[1]!;
    const g4 = await spawnGateway(["--store", REDIS_URL, "--config", cfgPath]);
    const bad = sim.replicas[2]!;
    bad.engine.setFault({ kind: "http_500" });
    // Fresh sessions through g4 until one is placed on the bad replica (no prefix key: placed by their own
    // key's rendezvous order): that 500 ejects it (eject_after 1); the call is retried elsewhere.
    for (let i = 0; ; i++) {
      await session([g4.url], `e${i}_0_0`, 300 + i, 1, 0, false);
      if ((await raw.hget(`${prefix}routing:health`, bad.url)) !== null) break;
      if (i > 40) throw new Error("the bad replica was never chosen");
    }
    const until_ms = Number(await raw.hget(`${prefix}routing:health`, bad.url));
    expect(until_ms).toBeGreaterThan(Date.now() + 100_000);
    bad.engine.setFault(null);
    const seen = bad.engine.requests.length;
    // Both instances route 20 new sessions (2 turns each, alternating) without touching it.
    await Promise.all(Array.from({ length: 20 }, (_, i) => session([g2.url, g4.url], `after${i}_0_0`, 400 + i, 2, i)));
    expect(bad.engine.requests.length).toBe(seen);
    const status = (await (await fetch(`${g2.url}/admin/replicas`, { headers: { authorization: "Bearer test-admin-token" } })).json()) as { replicas: { url: string; state: string; ejected_until_ms: number | null }[] };
    expect(status.replicas.find((r) => r.url === bad.url)).toMatchObject({ state: "ejected", ejected_until_ms: until_ms });
  }, HANG_MS);
});
