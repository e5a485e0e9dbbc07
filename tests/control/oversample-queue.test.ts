import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { JobWorker, type WorkerSummary } from "../../shared/jobs/job-worker.ts";
import type { BatchStats } from "../../shared/rollout/batch-run.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { CompleteGroup, FilteredGroup } from "../../shared/store/types.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { POLICY, ROOT, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Over-sampling, carry and DAPO filtering in queue mode: the API process enqueues, in-process JobWorkers (each
// its own runtime: own Redis connections, own session host) or `edgeloop worker` processes run the jobs over
// real Redis against the sim engine; the decisions are the Lua scripts of shared/jobs/oversample-lua.ts.

const redisUp = await requireRedis();
const N = 2;
const ROW_COUNT = 12;
const TARGET = 8;
const LATENCY = { prefill_ms_per_token: 0, decode_ms_per_token: 2 };
const json = { "content-type": "application/json" };
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const rowsWith = (prefix: string, from = 0, count = ROW_COUNT) => ROWS.slice(from, from + count).map((r, i) => ({ ...r, uid: `${prefix}${from + i}` }));
const tokensOf = (r: TrajectoryRecord) => ({ prompt_ids: r.prompt_ids, response_ids: r.response_ids, response_mask: r.response_mask, rollout_log_probs: r.rollout_log_probs, reward_score: r.reward_score, num_turns: r.num_turns });
const uidOf = (k: string) => k.slice(0, k.indexOf("_"));

async function waitUntil(cond: () => boolean | Promise<boolean>, ms = 30_000): Promise<void> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > ms) throw new Error("timed out");
    await Bun.sleep(10);
  }
}

describe.skipIf(!redisUp)("over-sampling in queue mode (Redis, workers)", () => {
  const prefixes: string[] = [];
  const rts: Runtime[] = [];
  const sims: RunningSimEngine[] = [];
  const workers: { w: JobWorker; done: Promise<WorkerSummary> }[] = [];
  let reward: ReturnType<typeof Bun.serve> | undefined;
  let bridge: UpstashBridge | undefined;
  const scored: string[] = [];
  const dir = mkdtempSync(join(tmpdir(), "osq-"));
  afterAll(async () => {
    for (const { w } of workers) w.stop();
    await Promise.all(workers.map((x) => x.done.catch(() => {})));
    for (const rt of rts) await rt.close();
    for (const s of sims) await s.stop();
    reward?.stop(true);
    await bridge?.stop();
    for (const p of prefixes) await deleteByPrefix(p);
    rmSync(dir, { recursive: true, force: true });
  });

  /** An API runtime (queue mode) and `count` in-process workers, each with its own runtime over the same Redis prefix. */
  const cluster = async (sim: RunningSimEngine, count: number, extra: { config?: string; store?: string } = {}) => {
    const prefix = randomPrefix("osq");
    prefixes.push(prefix);
    const flags = { engine: sim.urls[0]!, engineFormat: "vllm" as const, n: N, seed: 7, maxModelLen: 4096, concurrency: ROW_COUNT * N, store: REDIS_URL, storePrefix: prefix, ...extra };
    const api = await buildRuntime(flags, { jobs: "queue" });
    rts.push(api);
    const ws: { w: JobWorker; done: Promise<WorkerSummary> }[] = [];
    for (let i = 0; i < count; i++) {
      const rt = await buildRuntime(flags, { jobs: "queue" });
      rts.push(rt);
      const w = new JobWorker({ model: null, jobs: rt.jobs!, store: rt.batchStore, executorFor: rt.executorFor, consumer: `w${i}-${crypto.randomUUID().slice(0, 4)}`, concurrency: ROW_COUNT * N, blockMs: 100, cancelPollMs: 50 });
      const x = { w, done: w.run() };
      ws.push(x);
      workers.push(x);
    }
    return { api, app: createRolloutsApp({ service: api.service, apiToken: null }), workers: ws, prefix, flags };
  };
  const post = async (app: ReturnType<typeof createRolloutsApp>, body: Record<string, unknown>) => {
    const res = await app.request("/v1/rollouts", { method: "POST", headers: json, body: JSON.stringify({ global_steps: 1, ...body }) });
    expect(res.status).toBe(202);
    return (await res.json()) as { batch_id: string; keys: string[] };
  };

  test("target_groups 8 of 12, cancel, two workers: exactly 8 groups delivered; the surplus aborted, nothing stored, sessions dropped; another API process reports the same", async () => {
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    sims.push(sim);
    const { api, app, prefix } = await cluster(sim, 2);
    const { batch_id, keys } = await post(app, { rows: rowsWith("qc"), target_groups: TARGET, config: { rollout: { partial_rollout: "cancel" } } });
    const run = await api.service.lookup(batch_id);
    await Promise.race([run.run(), Bun.sleep(45_000)]);
    const s = run.stats();
    expect(s.done).toBe(true);
    const o = s.oversample!;
    expect(o).toMatchObject({ target_groups: TARGET, eager_rows: ROW_COUNT, partial_rollout: "cancel", delivered: TARGET, filtered: 0, replacements: 0, reached: true, carried: 0, groups_carried: 0, unused_groups: 0, unused_sessions: 0 });
    expect(o.groups_withdrawn).toBe(ROW_COUNT - TARGET);
    expect(s.counts.finished + o.cancelled).toBe(ROW_COUNT * N);
    expect(o.cancelled).toBeGreaterThanOrEqual(ROW_COUNT - TARGET);
    expect(o.interrupted).toBeLessThanOrEqual(o.cancelled);
    expect(s.counts.pending).toBe(0);
    expect(s.counts.running).toBe(0);
    expect(s.counts.records).toBe(s.counts.finished);

    const redis = rawRedis();
    try {
      // The trainers' stream: exactly TARGET complete groups of N records.
      const streamed = (await redis.xrange(`${prefix}groups:train`, "-", "+")).map(([, f]) => f[f.indexOf("uid") + 1]!).filter((u) => u.startsWith("qc"));
      expect(streamed.length).toBe(TARGET);
      expect((await redis.hget(`${prefix}jobs:batch:${batch_id}`, "os:delivered"))).toBe(String(TARGET));
      // Records: exactly the counted ones; a cancelled session has no record and no session hash.
      const recorded = new Set(run.records().map((r) => r.key));
      expect(recorded.size).toBe(s.counts.finished);
      for (const k of keys) expect(await redis.exists(`${prefix}traj:${k}`)).toBe(recorded.has(k) ? 1 : 0);
      const stopped = keys.filter((k) => !recorded.has(k));
      expect(stopped.length).toBe(o.cancelled);
      for (const k of stopped) expect(await redis.exists(`${prefix}session:${k}`)).toBe(0);
      // Withdrawn groups: flagged, never streamed; every other group delivered.
      const uids = [...new Set(keys.map(uidOf))];
      const flagged = [];
      for (const u of uids) if ((await redis.hget(`${prefix}group:${u}`, "cancelled")) === "1") flagged.push(u);
      expect(flagged.length).toBe(ROW_COUNT - TARGET);
      expect(new Set([...flagged, ...streamed]).size).toBe(ROW_COUNT);
      // No job of the batch left in the stream.
      const entries = await redis.xrange(`${prefix}jobs`, "-", "+");
      expect(entries.filter(([, f]) => f[f.indexOf("batch") + 1] === batch_id)).toEqual([]);
    } finally {
      await redis.quit();
    }
    // Another API process rebuilds the batch from Redis and reports the same figures.
    const other = await buildRuntime({ engine: sim.urls[0]!, n: N, store: REDIS_URL, storePrefix: prefix, maxModelLen: 4096 }, { jobs: "queue" });
    rts.push(other);
    const again = await other.service.lookup(batch_id);
    await Promise.race([again.run(), Bun.sleep(10_000)]);
    const s2 = again.stats();
    expect(s2.oversample).toEqual(o);
    expect(s2.counts).toEqual(s.counts);
    // The engine: nothing generating once the batch is done.
    await waitUntil(() => sim.replicas[0]!.engine.stats.inflight === 0, 5_000);
  }, HANG_MS);

  test("the delivery slot script: 40 group-completing writes racing from two connections get exactly the target; a failed write's slot goes to another group", async () => {
    const prefix = randomPrefix("osq");
    prefixes.push(prefix);
    const rtA = await buildRuntime({ n: N, store: REDIS_URL, storePrefix: prefix }, { jobs: "queue" });
    const rtB = await buildRuntime({ n: N, store: REDIS_URL, storePrefix: prefix }, { jobs: "queue" });
    rts.push(rtA, rtB);
    for (let round = 0; round < 5; round++) {
      const batch = `race-${round}-${crypto.randomUUID()}`;
      const redis = rawRedis();
      await redis.hset(`${prefix}jobs:batch:${batch}`, "os:target", "10", "os:mode", "cancel");
      await redis.quit();
      const uids = Array.from({ length: 40 }, (_, i) => `g${i}`);
      const qs = [rtA.jobs!, rtB.jobs!];
      // Every session of every group admitted from alternating connections: each group has exactly one last session.
      const verdicts = await Promise.all(uids.flatMap((u, i) => [0, 1].map((sid) => qs[(i + sid + round) % 2]!.admitSession(batch, u, sid, 2).then((v) => [u, v] as const))));
      const last = verdicts.filter(([, v]) => v === "last").map(([u]) => u);
      expect(last.sort()).toEqual([...uids].sort());
      const granted = (await Promise.all(uids.map((u, i) => qs[i % 2]!.reserveDelivery(batch, u).then((ok) => (ok ? u : null))))).filter((u): u is string => u !== null);
      expect(granted.length).toBe(10);
      // One write fails: its slot is released and goes to the next group asking; the rest commit; the 10th stops the batch.
      await qs[0]!.releaseDelivery(batch, granted[0]!);
      const late = uids.filter((u) => !granted.includes(u));
      const second = (await Promise.all(late.map((u, i) => qs[(i + 1) % 2]!.reserveDelivery(batch, u).then((ok) => (ok ? u : null))))).filter((u): u is string => u !== null);
      expect(second.length).toBe(1);
      const commits = await Promise.all([...granted.slice(1), ...second].map((u, i) => qs[i % 2]!.commitDelivery(batch, u)));
      expect(commits.filter(Boolean).length).toBe(1);
      expect(await qs[1]!.reserveDelivery(batch, late.find((u) => u !== second[0])!)).toBe(false);
      // A redelivered commit counts nothing twice; a session not admitted before the stop is surplus, an admitted one writes again.
      await qs[0]!.commitDelivery(batch, second[0]!);
      const st = await qs[0]!.oversampleState(batch);
      expect(st).toMatchObject({ delivered: 10, stopped: "cancel" });
      expect(await qs[0]!.admitSession(batch, "fresh", 0, 2)).toBe("surplus");
      expect(await qs[0]!.admitSession(batch, "g3", 1, 2)).toBe("last");
    }
  }, HANG_MS);

  for (const transport of ["redis", "upstash"] as const)
  test(`filter_groups (DAPO) across two workers (${transport === "redis" ? "Redis TCP" : "Upstash REST via the bridge"}): all-equal groups filtered and readable with include_filtered=1, reserve rows started in their place until 4 are delivered`, async () => {
    scored.length = 0;
    reward ??= Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: async (req) => {
        const { key } = (await req.json()) as { key: string };
        scored.push(key);
        const [uid, sid] = key.split("_");
        return Response.json({ score: uid!.startsWith("qmix") ? (sid === "0" ? 1 : 0) : 1 });
      },
    });
    if (transport === "upstash" && !bridge) {
      bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: "osq-token" });
      process.env.UPSTASH_REDIS_REST_URL = bridge.url;
      process.env.UPSTASH_REDIS_REST_TOKEN = "osq-token";
    }
    const cfg = join(dir, "config.json");
    writeFileSync(cfg, JSON.stringify({ reward: { url: `http://127.0.0.1:${reward.port}/score` } }));
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 1 } });
    sims.push(sim);
    const { api, app, prefix } = await cluster(sim, 2, { config: cfg, ...(transport === "upstash" ? { store: "upstash" } : {}) });
    const uids = ["qeqa0", "qeqa1", "qmix2", "qeqa3", "qeqa4", "qmix5", "qmix6", "qmix7", "qmix8", "qmix9"];
    const { batch_id } = await post(app, {
      rows: uids.map((u, i) => ({ ...ROWS[i]!, uid: u, reward_model: { style: "webhook", ground_truth: "x" } })),
      target_groups: 4,
      config: { rollout: { filter_groups: { metric: "reward", drop_if: "all_equal" } } },
    });
    const run = await api.service.lookup(batch_id);
    await Promise.race([run.run(), Bun.sleep(45_000)]);
    const s = run.stats();
    expect(s.done).toBe(true);
    // The same figures as the inline run of this batch (tests/control/dapo.test.ts).
    expect(s.oversample).toEqual({
      target_groups: 4,
      target_from: "target_groups",
      eager_rows: 4,
      partial_rollout: "cancel",
      delivered: 4,
      filtered: 4,
      replacements: 4,
      reached: true,
      cancelled: 0,
      carried: 0,
      interrupted: 0,
      groups_withdrawn: 0,
      groups_carried: 0,
      unused_groups: 2,
      unused_sessions: 4,
    });
    expect(s.counts.finished).toBe(16);
    expect(s.counts.finished + 4).toBe(s.counts.total);
    const got = (await (await app.request("/v1/groups?max=100&include_filtered=1")).json()) as { groups: CompleteGroup[]; filtered: FilteredGroup[] };
    expect(got.groups.map((g) => g.uid).filter((u) => u.startsWith("q")).sort()).toEqual(["qmix2", "qmix5", "qmix6", "qmix7"]);
    for (const g of got.groups) expect(g.records.map((r) => r.reward_score)).toEqual([1, 0]);
    expect(got.filtered.map((g) => g.uid).sort()).toEqual(["qeqa0", "qeqa1", "qeqa3", "qeqa4"]);
    for (const g of got.filtered) {
      expect(g.reason).toBe("reward all_equal 1");
      expect(g.records.map((r) => r.reward_score)).toEqual([1, 1]);
    }
    for (const u of ["qmix8", "qmix9"]) expect((await api.store.groupStatus(u)).expected).toBeNull();
    expect(scored.some((k) => k.startsWith("qmix8") || k.startsWith("qmix9"))).toBe(false);
    const redis = rawRedis();
    try {
      expect(await redis.lrange(`${prefix}jobs:batch:${batch_id}:launched`, 0, -1)).toEqual(["qeqa4", "qmix5", "qmix6", "qmix7"]);
      expect(await redis.lrange(`${prefix}jobs:batch:${batch_id}:reserve`, 0, -1)).toEqual(["qmix8", "qmix9"]);
    } finally {
      await redis.quit();
    }
  }, HANG_MS);

  test("partial_rollout carry across two workers: the stopped trajectories stay checkpointed in Redis and resume in the next batch with the tokens of an uninterrupted run, versions recorded per token", async () => {
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    sims.push(sim);
    const carry = { rollout: { partial_rollout: "carry" } };
    // The reference: the same rows (same uids, so the same per-trajectory seeds) run to the end inline.
    const ref = await buildRuntime({ engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, concurrency: ROW_COUNT * N });
    rts.push(ref);
    const whole = await ref.service.accept({ rows: rowsWith("qk"), global_steps: 1, model_version: null, validate: false, config: carry } as never);
    await whole.run.run();
    const expected = new Map(whole.run.records().map((r) => [r.key, tokensOf(r)]));
    expect(expected.size).toBe(ROW_COUNT * N);

    // Made deterministic by events, not timing: rows 8–11 (rule j plays row j) hang at their second turn until the
    // stop aborts them, so each of their sessions is carried with turn 0 committed; rows 0–7 wait at their second
    // turn until all 8 of those sessions are hanging, so the target cannot be reached before.
    const engine = sim.replicas[0]!.engine;
    const HUNG = new Set(["qk8", "qk9", "qk10", "qk11"]);
    engine.setScript({ ...POLICY, seed: 7, rules: POLICY.rules.map((r: object, j: number) => (j >= 8 && j < 12 ? { ...r, fault: { kind: "hang", turn: 1 } } : r)) });
    const hanging = new Set<string>();
    let open!: () => void;
    const allHanging = new Promise<void>((r) => (open = r));
    engine.gate = (req) => {
      const key = req.routing_key ?? "";
      if (engine.assistantTurns(req.prompt_ids).count < 1) return undefined;
      if (HUNG.has(uidOf(key))) {
        hanging.add(key);
        if (hanging.size === HUNG.size * N) open();
        return undefined;
      }
      return allHanging;
    };
    const { api, app, prefix } = await cluster(sim, 2);
    await api.service.policy.set("A");
    // Workers cache the current version for 250 ms (a trainer's pause → version → resume drops the cache; here nothing pauses).
    await Bun.sleep(300);
    const first = await post(app, { rows: rowsWith("qk"), target_groups: TARGET, config: carry });
    const run1 = await api.service.lookup(first.batch_id);
    await Promise.race([run1.run(), Bun.sleep(45_000)]);
    const s1 = run1.stats();
    expect(s1.done).toBe(true);
    const o = s1.oversample!;
    expect(o).toMatchObject({ delivered: TARGET, reached: true, cancelled: 0, groups_withdrawn: 0, groups_carried: ROW_COUNT - TARGET, partial_rollout: "carry" });
    expect(s1.counts.finished + o.carried).toBe(ROW_COUNT * N);
    expect(o.carried).toBe(HUNG.size * N);
    expect(o.interrupted).toBe(HUNG.size * N);
    const recorded = new Set(run1.records().map((r) => r.key));
    const carriedKeys = first.keys.filter((k) => !recorded.has(k));
    expect(carriedKeys.length).toBe(o.carried);
    const carriedUids = [...new Set(carriedKeys.map(uidOf))];
    expect(carriedUids.length).toBe(ROW_COUNT - TARGET);
    const redis = rawRedis();
    try {
      // Carried: no record, the group open (neither withdrawn nor delivered); the interrupted ones keep their session hash.
      let kept = 0;
      for (const k of carriedKeys) {
        expect(await redis.exists(`${prefix}traj:${k}`)).toBe(0);
        kept += await redis.exists(`${prefix}session:${k}`);
      }
      expect(kept).toBeGreaterThanOrEqual(o.interrupted);
      for (const u of carriedUids) expect(await api.store.groupStatus(u)).toMatchObject({ complete: false });
      for (const u of carriedUids) expect((await api.store.groupStatus(u)).cancelled).toBeUndefined();
    } finally {
      await redis.quit();
    }

    expect(carriedUids.sort()).toEqual([...HUNG].sort());
    // The next batch (a plain one) names the carried uids: finished sessions handed back, the others resumed.
    engine.gate = undefined;
    engine.setScript({ ...POLICY, seed: 7 });
    const secondStart = Date.now();
    await api.service.policy.set("B");
    await Bun.sleep(300);
    const idx = carriedUids.map((u) => Number(u.slice(2)));
    const second = await post(app, { rows: idx.map((i) => ({ ...ROWS[i]!, uid: `qk${i}` })).reverse(), config: { rollout: { partial_rollout: "cancel" } } });
    const run2 = await api.service.lookup(second.batch_id);
    await Promise.race([run2.run(), Bun.sleep(45_000)]);
    const s2 = run2.stats();
    expect(s2.done).toBe(true);
    expect(s2.counts.finished).toBe(carriedUids.length * N);
    expect(s2.counts.failed).toBe(0);
    const all = new Map([...run1.records(), ...run2.records()].map((r) => [r.key, tokensOf(r)]));
    expect(all.size).toBe(ROW_COUNT * N);
    for (const [k, v] of expected) expect(all.get(k)).toEqual(v);
    const streamed = await api.store.readCompleteGroups({ consumer: "t", max: 100, block_ms: 0, partition: "train" });
    expect(streamed.map((g) => g.uid).filter((u) => u.startsWith("qk")).length).toBe(ROW_COUNT);
    // Resumed, not rerun: fewer engine calls in batch 2 than turns; tokens sampled before the stop keep version A, the rest B.
    const resumed = run2.records().filter((r) => engine.requests.filter((l) => l.routing_key === r.key && l.received_ms! >= secondStart).length < r.num_turns);
    expect(resumed.length).toBe(HUNG.size * N);
    const versions = run2.records().map((r) => (r.extra_fields.token_versions as [number, unknown][]).map((seg) => seg[1]));
    expect(versions.filter((v) => v[0] === "A" && v.at(-1) === "B").length).toBe(HUNG.size * N);
    console.log(`queue carry: ${o.carried} sessions carried (${o.interrupted} interrupted); ${resumed.length} resumed mid-trajectory in batch 2`);
  }, HANG_MS);

  test("two workers racing to complete the last groups (no decode latency, 5 rounds): never target+1 delivered", async () => {
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok });
    sims.push(sim);
    const { api, app } = await cluster(sim, 2);
    for (let round = 0; round < 5; round++) {
      const { batch_id } = await post(app, { rows: rowsWith(`qr${round}x`, 0, 8), target_groups: 3 });
      const run = await api.service.lookup(batch_id);
      await Promise.race([run.run(), Bun.sleep(30_000)]);
      const s = run.stats();
      expect(s.done).toBe(true);
      expect(s.oversample!.delivered).toBe(3);
      expect(s.counts.finished + s.oversample!.cancelled).toBe(16);
      const groups = await api.store.readCompleteGroups({ consumer: `r${round}`, max: 100, block_ms: 0, partition: "train" });
      expect(groups.filter((g) => g.uid.startsWith(`qr${round}x`)).length).toBe(3);
    }
  }, HANG_MS);

  test("an `edgeloop worker` process SIGKILLed mid-batch: its jobs are reclaimed, exactly the target delivered, the batch ends", async () => {
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 3 } });
    sims.push(sim);
    const prefix = randomPrefix("osq");
    prefixes.push(prefix);
    const api = await buildRuntime({ engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, store: REDIS_URL, storePrefix: prefix }, { jobs: "queue", jobQueue: { leaseMs: 1500 } });
    rts.push(api);
    const app = createRolloutsApp({ service: api.service, apiToken: null });
    const main = join(ROOT, "infra", "cli", "main.ts");
    const procs: ReturnType<typeof Bun.spawn>[] = [];
    const spawn = (name: string) => {
      const p = Bun.spawn([process.execPath, main, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--engine", sim.urls[0]!, "--max-model-len", "4096", "--concurrency", "8", "--idle-exit", "3", "--lease", "1.5", "--consumer", name], {
        stdout: "pipe",
        stderr: "pipe",
        env: { ...process.env, NO_COLOR: "1" },
      });
      procs.push(p);
      return p;
    };
    const redis = rawRedis();
    try {
      const { batch_id, keys } = await post(app, { rows: rowsWith("qv"), target_groups: TARGET });
      const pendingOf = async (c: string) => {
        const [, , , consumers] = (await redis.xpending(`${prefix}jobs`, "workers")) as [number, string, string, [string, string][] | null];
        return Number((consumers ?? []).find(([x]) => x === c)?.[1] ?? 0);
      };
      const victim = spawn("victim");
      await waitUntil(async () => (await pendingOf("victim")) > 0, 30_000);
      const survivor = spawn("survivor");
      await waitUntil(async () => (await redis.keys(`${prefix}traj:qv*`)).length >= 4 && (await pendingOf("victim")) > 0, 30_000);
      victim.kill("SIGKILL");
      await victim.exited;
      const run = await api.service.lookup(batch_id);
      await Promise.race([run.run(), Bun.sleep(60_000)]);
      const s = run.stats();
      expect(s.done).toBe(true);
      expect(s.oversample!.delivered).toBe(TARGET);
      expect(s.counts.finished + s.oversample!.cancelled).toBe(ROW_COUNT * N);
      const streamed = (await redis.xrange(`${prefix}groups:train`, "-", "+")).map(([, f]) => f[f.indexOf("uid") + 1]!);
      expect(streamed.length).toBe(TARGET);
      const recorded = new Set(run.records().map((r) => r.key));
      for (const k of keys) expect(await redis.exists(`${prefix}traj:${k}`)).toBe(recorded.has(k) ? 1 : 0);
      const code = await survivor.exited;
      const out = await new Response(survivor.stdout).text();
      if (code !== 0) throw new Error(`survivor exited ${code}: ${await new Response(survivor.stderr).text()}`);
      const summary = JSON.parse(out.trim().split("\n").pop()!) as WorkerSummary;
      console.log(`killed victim; survivor ${JSON.stringify(summary)}`);
      expect(summary.reclaimed).toBeGreaterThan(0);
      expect((await redis.xrange(`${prefix}jobs`, "-", "+")).length).toBe(0);
    } finally {
      for (const p of procs) p.kill("SIGKILL");
      await redis.quit();
    }
  }, HANG_MS);

  test("inline on a Redis store (serve --jobs inline): surplus cancelled by over-sampling and trajectories aborted by DELETE leave no durable session hash", async () => {
    const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    sims.push(sim);
    const prefix = randomPrefix("osq");
    prefixes.push(prefix);
    const rt = await buildRuntime({ engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, concurrency: ROW_COUNT * N, store: REDIS_URL, storePrefix: prefix }, { jobs: "inline" });
    rts.push(rt);
    const app = createRolloutsApp({ service: rt.service, apiToken: null });
    const redis = rawRedis();
    try {
      const { batch_id, keys } = await post(app, { rows: rowsWith("qi"), target_groups: TARGET });
      const run = rt.service.batch(batch_id);
      await run.run();
      const o = run.stats().oversample!;
      expect(o.delivered).toBe(TARGET);
      expect(o.cancelled).toBeGreaterThan(0);
      const recorded = new Set(run.records().map((r) => r.key));
      const stopped = keys.filter((k) => !recorded.has(k));
      expect(stopped.length).toBe(o.cancelled);
      for (const k of stopped) expect(await redis.exists(`${prefix}session:${k}`)).toBe(0);
      for (const k of recorded) expect(await redis.exists(`${prefix}session:${k}`)).toBe(1);

      // DELETE with trajectories in flight: the aborted ones' sessions are dropped too.
      const b = await post(app, { rows: rowsWith("qd", 0, 6) });
      await waitUntil(async () => (await redis.keys(`${prefix}session:qd*`)).length >= 6 && sim.replicas[0]!.engine.stats.inflight > 0);
      const del = (await (await app.request(`/v1/rollouts/${b.batch_id}`, { method: "DELETE" })).json()) as BatchStats;
      expect(del.cancelled!.sessions).toBeGreaterThan(0);
      const run2 = rt.service.batch(b.batch_id);
      const kept = new Set(run2.records().map((r) => r.key));
      for (const k of b.keys) expect(await redis.exists(`${prefix}session:${k}`)).toBe(kept.has(k) ? 1 : 0);
    } finally {
      await redis.quit();
    }
  }, HANG_MS);
});
