import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Over-sampling inline (memory store) against the sim engine with decode latency: the scripted policy gives
// prompts of 73…197 response tokens (4…8 turns), so the long ones are the stragglers.

const N = 2;
const ROW_COUNT = 12;
const TARGET = 8;
const LATENCY = { prefill_ms_per_token: 0, decode_ms_per_token: 2 };
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const rowsWith = (prefix: string, from = 0, count = ROW_COUNT) => ROWS.slice(from, from + count).map((r, i) => ({ ...r, uid: `${prefix}${from + i}` }));
const req = (rows: unknown[], extra: Record<string, unknown> = {}) => ({ rows, global_steps: 1, model_version: null, validate: false, ...extra });
const tokensOf = (r: TrajectoryRecord) => ({ prompt_ids: r.prompt_ids, response_ids: r.response_ids, response_mask: r.response_mask, rollout_log_probs: r.rollout_log_probs, reward_score: r.reward_score, num_turns: r.num_turns });

describe("over-sampling inline (memory store)", () => {
  let sim: RunningSimEngine;
  const rts: Runtime[] = [];
  afterAll(async () => {
    for (const rt of rts) await rt.close();
    await sim?.stop();
  });
  const runtime = async (partial: "cancel" | "carry") => {
    const rt = await buildRuntime({ engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, concurrency: ROW_COUNT * N });
    rts.push(rt);
    return { rt, config: { rollout: { partial_rollout: partial } } };
  };

  test("target_groups 8 of 12: exactly 8 groups delivered, the surplus cancelled (no records, groups withdrawn, no engine call after)", async () => {
    sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    const engine = sim.replicas[0]!.engine;
    const { rt, config } = await runtime("cancel");
    const b = await rt.service.accept(req(rowsWith("oc"), { target_groups: TARGET, config }));
    await b.run.run();
    const s = b.run.stats();
    const endedAt = s.finished_at!;
    const o = s.oversample!;
    expect(o.target_groups).toBe(TARGET);
    expect(o.reached).toBe(true);
    expect(o.delivered).toBe(TARGET);
    expect(o.carried).toBe(0);
    expect(o.groups_withdrawn).toBe(ROW_COUNT - TARGET);
    expect(o.unused_groups).toBe(0);
    // Sessions: finished + cancelled = total; every cancelled one was running (all started at once).
    expect(s.counts.finished + o.cancelled).toBe(ROW_COUNT * N);
    expect(o.interrupted).toBe(o.cancelled);
    expect(s.counts.pending).toBe(0);
    expect(s.counts.running).toBe(0);
    expect(s.counts.records).toBe(s.counts.finished);
    // The trainers' stream holds exactly the 8 delivered groups, each complete with N records.
    const groups = await rt.store.readCompleteGroups({ consumer: "t", max: 100, block_ms: 0, partition: "train" });
    expect(groups.length).toBe(TARGET);
    for (const g of groups) expect(g.records.length).toBe(N);
    const delivered = new Set(groups.map((g) => g.uid));
    // Withdrawn groups: flagged, their unfinished sessions have no record.
    const recorded = new Set(b.run.records().map((r) => r.key));
    for (const key of b.keys) expect((await rt.store.get(key)) !== null).toBe(recorded.has(key));
    const statuses = await Promise.all([...new Set(b.keys.map((k) => k.split("_")[0]!))].map((u) => rt.store.groupStatus(u)));
    expect(statuses.filter((x) => x.cancelled).map((x) => x.uid).sort()).toEqual(statuses.filter((x) => !delivered.has(x.uid)).map((x) => x.uid).sort());
    expect(recorded.size).toBe(s.counts.finished);
    expect(o.cancelled).toBeGreaterThanOrEqual((ROW_COUNT - TARGET) * 1);
    // The engine: nothing still generating, no request after the batch ended.
    await Bun.sleep(300);
    expect(engine.stats.inflight).toBe(0);
    expect(engine.requests.filter((l) => l.received_ms! > endedAt + 50).length).toBe(0);
  }, HANG_MS);

  test("rollout.oversample 1.5: target = ceil(rows / 1.5); a target over the rows is a 400 naming target_groups", async () => {
    const { rt } = await runtime("cancel");
    const b = await rt.service.accept(req(rowsWith("oo", 0, 6), { config: { rollout: { oversample: 1.5 } } }));
    await b.run.run();
    expect(b.run.stats().oversample!.target_groups).toBe(4);
    expect(b.run.stats().oversample!.delivered).toBe(4);
    await expect(rt.service.accept(req(rowsWith("ox", 0, 3), { target_groups: 4 }))).rejects.toMatchObject({ field: "target_groups" });
    await expect(rt.service.accept(req(rowsWith("oy", 0, 3), { config: { rollout: { oversample: 0.5 } } }))).rejects.toMatchObject({ status: 400 });
  }, HANG_MS);

  test("partial_rollout carry: the stopped trajectories resume in the next batch naming their uids, with the tokens of an uninterrupted run", async () => {
    // The reference: the same rows (same uids, so the same per-trajectory seeds) run to the end.
    const ref = await runtime("carry");
    const whole = await ref.rt.service.accept(req(rowsWith("cc"), { config: ref.config }));
    await whole.run.run();
    const expected = new Map(whole.run.records().map((r) => [r.key, tokensOf(r)]));
    expect(expected.size).toBe(ROW_COUNT * N);

    const { rt, config } = await runtime("carry");
    await rt.service.policy.set("A");
    const first = await rt.service.accept(req(rowsWith("cc"), { target_groups: TARGET, config }));
    await first.run.run();
    const s1 = first.run.stats();
    const o = s1.oversample!;
    expect(o.delivered).toBe(TARGET);
    expect(o.cancelled).toBe(0);
    expect(o.groups_withdrawn).toBe(0);
    expect(o.groups_carried).toBe(ROW_COUNT - TARGET);
    expect(s1.counts.finished + o.carried).toBe(ROW_COUNT * N);
    expect(o.carried).toBeGreaterThan(0);
    const carriedUids = [...new Set(first.keys.map((k) => k.split("_")[0]!))].filter((u) => !first.run.records().some((r) => r.uid === u && r.session_id === 0) || !first.run.records().some((r) => r.uid === u && r.session_id === 1));
    expect(carriedUids.length).toBe(ROW_COUNT - TARGET);
    // Carried groups are open (not withdrawn, not delivered); some of their sessions stopped mid-trajectory with a checkpoint.
    for (const u of carriedUids) expect((await rt.store.groupStatus(u)).cancelled).toBeUndefined();
    const engine = sim.replicas[0]!.engine;
    const secondStart = Date.now();

    // The next batch names the carried uids: finished sessions handed back, the others resumed from their checkpoints.
    const idx = carriedUids.map((u) => Number(u.slice(2)));
    // Without carry in its own config (a fresh user's finding: the memory store then ran them again from scratch).
    void config;
    await rt.service.policy.set("B");
    const second = await rt.service.accept(req(idx.map((i) => ({ ...ROWS[i]!, uid: `cc${i}` })).reverse(), { config: { rollout: { partial_rollout: "cancel" } } }));
    expect(second.reused_uids.sort()).toEqual([...carriedUids].sort());
    await second.run.run();
    const s2 = second.run.stats();
    expect(s2.counts.finished).toBe(carriedUids.length * N);
    expect(s2.counts.failed).toBe(0);
    expect(s2.counts.reused + s2.counts.records).toBe(carriedUids.length * N);
    // Every trajectory of the two batches equals the uninterrupted run's, token for token.
    const all = new Map([...first.run.records(), ...second.run.records()].map((r) => [r.key, tokensOf(r)]));
    expect(all.size).toBe(ROW_COUNT * N);
    for (const [k, v] of expected) expect(all.get(k)).toEqual(v);
    const groups = await rt.store.readCompleteGroups({ consumer: "t", max: 100, block_ms: 0, partition: "train" });
    expect(groups.length).toBe(ROW_COUNT);
    // Resumed, not rerun: a carried session's calls in batch 2 are fewer than its turns (the turns before its checkpoint were kept).
    const callsAfter = (key: string) => engine.requests.filter((l) => l.routing_key === key && l.received_ms! >= secondStart).length;
    const resumed = second.run.records().filter((r) => callsAfter(r.key) < r.num_turns);
    expect(resumed.length).toBeGreaterThan(0);
    // Their tokens from before the stop keep the version they were sampled under (A), the rest B: kept, not sampled again.
    const versions = second.run.records().map((r) => (r.extra_fields.token_versions as [number, unknown][]).map((seg) => seg[1]));
    expect(versions.filter((v) => v[0] === "A" && v.at(-1) === "B").length).toBeGreaterThan(0);
    console.log(`carry: ${o.carried} sessions carried (${o.interrupted} interrupted); ${resumed.length} resumed mid-trajectory in batch 2`);
  }, HANG_MS);
});
