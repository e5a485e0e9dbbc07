/**
 * Over-sampling and carry on the real pipeline: step wall time of a batch of
 * 64 groups × 8 with a long-tailed response-length distribution.
 *
 * The engine is the simulated one, in-process, through edgeloop's whole
 * inline path (`buildRuntime`: RolloutService → BatchRun → executor →
 * `single_turn_agent` → TrajectoryBuilder → memory transfer queue). Its
 * script draws every turn's length from lognormal(median 2,000 tokens,
 * σ 0.8), capped at 16,384 (sim script `lengths`), and it decodes at
 * 1 ms per token with no prefill cost and no queueing — 16 replicas'
 * worth of capacity with every trajectory of the batch decoding at once
 * (640 sequences over 16 replicas is 40 each, within a replica's batch).
 * 1 ms keeps the step latency-bound on a 2-core machine (edgeloop's own CPU
 * for 1.4 M tokens is a few seconds; at 0.04 ms/token the step would
 * measure CPU, not stragglers).
 * - plain: 64 rows; the step ends when the slowest of 512 trajectories does.
 * - oversample 1.25: 80 rows, `target_groups` 64; once 64 groups are
 *   delivered the rest are cancelled (engine calls aborted, groups withdrawn).
 * - carry: as oversample with `partial_rollout: carry`; stopped sessions are
 *   suspended at their last checkpoint and their groups head the next step's
 *   rows (finished sessions handed back, unfinished ones resumed); mean over
 *   the steps after a warm-up step. A single-turn trajectory's checkpoint is
 *   its prompt: a carried session restarts its one turn (the engine call was
 *   cut by the client, so no partial tokens came back).
 *
 * Run: ./node_modules/.bin/bun bench/oversample.ts [--steps 3] [--groups 64] [--ms-per-token 1]  (~2.5 min)
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { buildRuntime, type Runtime } from "../infra/cli/runtime.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { parseSimScript } from "../infra/sim-engine/script.ts";

const { values: args } = parseArgs({
  options: { steps: { type: "string", default: "3" }, groups: { type: "string", default: "64" }, "ms-per-token": { type: "string", default: "1" } },
});
const STEPS = Number(args.steps);
const GROUPS = Number(args.groups);
const ROWS = Math.ceil(GROUPS * 1.25);
const N = 8;
const MS_PER_TOKEN = Number(args["ms-per-token"]);
const LENGTHS = { median: 2000, sigma: 0.8, min: 16, max: 16_384 };

const dir = mkdtempSync(join(tmpdir(), "edgeloop-oversample-"));
const scriptPath = join(dir, "script.json");
writeFileSync(scriptPath, JSON.stringify({ seed: 3, lengths: LENGTHS, default: ["The answer follows from the steps above."] }));
const configPath = join(dir, "config.json");
writeFileSync(
  configPath,
  JSON.stringify({
    concurrency: ROWS * N,
    engine: { url: "sim", script: scriptPath, sim_latency: { decode_ms_per_token: MS_PER_TOKEN } },
    rollout: { n: N, prompt_length: 256, response_length: 16_384, max_model_len: 20_000, calculate_log_probs: true, agent: { default_agent_loop: "single_turn_agent" } },
  }),
);

let fresh = 0;
const newRows = (k: number) => Array.from({ length: k }, () => `r${fresh++}`);
const row = (uid: string) => ({ uid, prompt: [{ role: "user", content: `Question ${uid}: think it through.` }] });

interface StepResult {
  ms: number;
  delivered: number;
  carried: number;
  cancelled: number;
  tokens: number;
  carriedUids: string[];
}

async function step(rt: Runtime, uids: string[], target: number | undefined, partial: "cancel" | "carry"): Promise<StepResult> {
  const t0 = performance.now();
  const b = await rt.service.accept({
    rows: uids.map(row),
    global_steps: 1,
    model_version: null,
    validate: false,
    ...(target ? { target_groups: target } : {}),
    config: { rollout: { partial_rollout: partial } },
  });
  await b.run.run();
  const ms = performance.now() - t0;
  const s = b.run.stats();
  const done = new Map<string, number>();
  let tokens = 0;
  for (const r of b.run.records()) {
    done.set(r.uid, (done.get(r.uid) ?? 0) + 1);
    tokens += r.response_ids.length;
  }
  return {
    ms,
    delivered: s.oversample?.delivered ?? uids.length,
    carried: s.oversample?.carried ?? 0,
    cancelled: s.oversample?.cancelled ?? 0,
    tokens,
    carriedUids: [...b.run.plan.groups.keys()].filter((u) => (done.get(u) ?? 0) < N),
  };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const pct = (a: number, b: number) => `${(100 * (1 - a / b)).toFixed(1)}%`;

const rt = await buildRuntime({ config: configPath });
try {
  // Warm-up: tokenizer, JIT.
  await step(rt, newRows(4), undefined, "cancel");
  const plain: StepResult[] = [];
  const over: StepResult[] = [];
  const carry: StepResult[] = [];
  for (let i = 0; i < STEPS; i++) plain.push(await step(rt, newRows(GROUPS), undefined, "cancel"));
  for (let i = 0; i < STEPS; i++) over.push(await step(rt, newRows(ROWS), GROUPS, "cancel"));
  let carried: string[] = [];
  for (let i = 0; i <= STEPS; i++) {
    const r = await step(rt, [...carried, ...newRows(ROWS - carried.length)], GROUPS, "carry");
    if (i > 0) carry.push(r);
    carried = r.carriedUids;
  }
  const l = parseSimScript({ lengths: LENGTHS }).lengths!;
  const xs = Array.from({ length: 100_000 }, (_, i) => SimEngine.drawLength(l, 3, `x${i}_0_0`, 0)).sort((a, b) => a - b);
  console.log(`engine: sim in-process, lengths lognormal median ${xs[50_000]}, p90 ${xs[90_000]}, p99 ${xs[99_000]}, max ${xs.at(-1)} tokens; ${MS_PER_TOKEN} ms/token; ${STEPS} steps each`);
  const line = (name: string, rs: StepResult[], base?: number) =>
    console.log(
      `${name.padEnd(34)} step ${mean(rs.map((r) => r.ms)).toFixed(0).padStart(5)} ms${base ? `, ${pct(mean(rs.map((r) => r.ms)), base)} shorter` : ""}; groups delivered ${mean(rs.map((r) => r.delivered)).toFixed(0)}; tokens stored ${(mean(rs.map((r) => r.tokens)) / 1e6).toFixed(2)} M` +
        (rs[0]!.carried || rs[0]!.cancelled ? `; sessions ${rs[0]!.carried ? "carried" : "cancelled"} ${mean(rs.map((r) => r.carried + r.cancelled)).toFixed(0)}/step` : ""),
    );
  const base = mean(plain.map((r) => r.ms));
  line(`plain (${GROUPS} groups x ${N})`, plain);
  line(`oversample 1.25 (${ROWS} rows → ${GROUPS})`, over, base);
  line(`carry (${ROWS} rows → ${GROUPS}, carried)`, carry, base);
} finally {
  await rt.close();
  rmSync(dir, { recursive: true, force: true });
}
