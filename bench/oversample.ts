/**
 * Over-sampling and carry: step wall time of a batch of 64 groups × 8 with a
 * long-tailed (lognormal) response-length distribution.
 *
 * The engine is a latency model, not the sim engine's scripted policy: each
 * trajectory's length is drawn from lognormal(μ = ln 2000, σ = 0.8) tokens
 * (capped at 16 384; seeded by uid and session), decoded at 0.04 ms per
 * token — 16 replicas' worth of capacity with every trajectory of the
 * batch decoding at once (no queueing: 640 sequences over 16 replicas is
 * 40 each, within a replica's batch). Runs through the real BatchRun
 * (memory transfer queue): groups registered, records stored, the surplus
 * aborted through the trajectories' AbortSignals.
 * - plain: 64 rows; the step ends when the slowest of 512 trajectories does.
 * - oversample 1.25: 80 rows, target 64 groups; the 16 slowest groups are cancelled.
 * - carry: as oversample, but a stopped trajectory keeps the tokens it had
 *   (the executor's own progress table stands for the durable session's
 *   checkpoint) and its group heads the next step's rows; mean over 6 steps
 *   after a warm-up step.
 *
 * Run: ./node_modules/.bin/bun bench/oversample.ts
 */
import { BatchRun, type TrajectoryExecutor } from "../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../shared/rollout/batch.ts";
import { RolloutConfig, type AgentLoopOutput } from "../shared/schema/index.ts";
import { MemoryTransferQueue } from "../shared/store/memory-transfer-queue.ts";

const GROUPS = 64;
const N = 8;
const MU = Math.log(2000);
const SIGMA = 0.8;
const MAX_LEN = 16_384;
const MS_PER_TOKEN = 0.04;
const STEPS = 6;

function hash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}
/** mulberry32: a small seeded PRNG, uniform in [0, 1). */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
/** A lognormal length from a key (Box–Muller over a PRNG seeded by the key's hash). */
function lengthOf(key: string): number {
  const rnd = mulberry32(hash(key));
  const u1 = 1 - rnd();
  const u2 = rnd();
  const z = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  return Math.min(MAX_LEN, Math.max(16, Math.round(Math.exp(MU + SIGMA * z))));
}

/** Decodes `lengthOf(key)` tokens at MS_PER_TOKEN; with `progress`, an aborted run keeps its tokens for the next one. */
function executor(progress: Map<string, number> | null): TrajectoryExecutor {
  return {
    agentNameFor: () => "latency_model",
    async run(t, _plan, signal) {
      const total = lengthOf(t.key);
      const done = progress?.get(t.key) ?? 0;
      const t0 = performance.now();
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(resolve, (total - done) * MS_PER_TOKEN);
        signal?.addEventListener("abort", () => {
          clearTimeout(timer);
          if (progress) progress.set(t.key, Math.min(total, done + Math.floor((performance.now() - t0) / MS_PER_TOKEN)));
          reject(signal.reason);
        }, { once: true });
      });
      progress?.set(t.key, total); // a carried group's finished sessions are handed back (instant) next step, as the store does
      const out: AgentLoopOutput = {
        prompt_ids: [1, 2, 3],
        response_ids: [4],
        response_mask: [1],
        response_logprobs: null,
        reward_score: 1,
        num_turns: 2,
        truncated: false,
        finish_reason: "stop",
        metrics: { generate_sequences: (total * MS_PER_TOKEN) / 1000, tool_calls: 0, compute_score: 0, num_preempted: -1 },
        extra_fields: { response_tokens: total },
      };
      return { agentName: "latency_model", outputs: [out] };
    },
  };
}

const rollout = RolloutConfig.parse({ n: N, calculate_log_probs: false, response_length: 512 });

async function step(rows: string[], target: number | undefined, partial: "cancel" | "carry", progress: Map<string, number> | null) {
  const req = RolloutRequest.parse({ rows: rows.map((uid) => ({ uid, prompt: [{ role: "user", content: "q" }] })), ...(target ? { target_groups: target } : {}) });
  const plan = planBatch(req, { ...rollout, partial_rollout: partial });
  const store = new MemoryTransferQueue();
  const run = new BatchRun(plan, { executor: executor(progress), store, rollout, concurrency: rows.length * N });
  const t0 = performance.now();
  await run.run();
  const ms = performance.now() - t0;
  const s = run.stats();
  const open = new Set(plan.trajectories.map((t) => t.uid));
  for (const r of run.records()) open.delete(r.uid);
  const finishedUids = new Map<string, number>();
  for (const r of run.records()) finishedUids.set(r.uid, (finishedUids.get(r.uid) ?? 0) + 1);
  const carried = [...plan.groups.keys()].filter((u) => (finishedUids.get(u) ?? 0) < N);
  return { ms, stats: s, carried };
}

let fresh = 0;
const newRows = (k: number) => Array.from({ length: k }, () => `r${fresh++}`);

const plain: number[] = [];
const over: number[] = [];
for (let i = 0; i < STEPS; i++) plain.push((await step(newRows(GROUPS), undefined, "cancel", null)).ms);
for (let i = 0; i < STEPS; i++) over.push((await step(newRows(Math.ceil(GROUPS * 1.25)), GROUPS, "cancel", null)).ms);
// Carry: a warm-up step, then STEPS steps whose rows are the carried groups first, then fresh ones up to 80.
const progress = new Map<string, number>();
let carriedRows: string[] = [];
const carry: number[] = [];
let carriedSessions = 0;
for (let i = 0; i <= STEPS; i++) {
  const rows = [...carriedRows, ...newRows(Math.ceil(GROUPS * 1.25) - carriedRows.length)];
  const r = await step(rows, GROUPS, "carry", progress);
  if (i > 0) carry.push(r.ms);
  carriedSessions += r.stats.oversample?.carried ?? 0;
  carriedRows = r.carried;
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const pct = (a: number, b: number) => `${(100 * (1 - a / b)).toFixed(1)}%`;
const lengths = Array.from({ length: 100_000 }, (_, i) => lengthOf(`x${i}`)).sort((a, b) => a - b);
console.log(`lengths: median ${lengths[50_000]}, p90 ${lengths[90_000]}, p99 ${lengths[99_000]}, max ${lengths[99_999]} tokens; ${MS_PER_TOKEN} ms/token`);
console.log(`plain (64 groups x 8):          step ${mean(plain).toFixed(0)} ms (mean of ${STEPS})`);
console.log(`oversample 1.25 (80 rows → 64): step ${mean(over).toFixed(0)} ms, ${pct(mean(over), mean(plain))} shorter`);
console.log(`carry (80 rows → 64, carried):  step ${mean(carry).toFixed(0)} ms, ${pct(mean(carry), mean(plain))} shorter; ${(carriedSessions / (STEPS + 1)).toFixed(0)} sessions carried per step`);
