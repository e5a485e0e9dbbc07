import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { SIM_ENGINE_VERSIONS } from "../../infra/sim-engine/wire.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";

/**
 * The adapters against every engine version the simulator plays: the same
 * batch (tool_agent rows, n = 2) through each wire format and version over
 * loopback HTTP gives exactly the records of the in-process reference —
 * token ids, masks, log-probs — so a version's reply shape (vLLM main's
 * `{token_id, logprob, rank}` entries, 0.2x's `token_id:N` strings) changes
 * nothing a trainer reads.
 */

const N = 2;
const rows = ROWS.slice(0, 4).map((r, i) => ({ ...r, uid: `row-${i}` }));
let reference: Map<string, TrajectoryRecord>;

async function runBatch(engine: string | undefined, format: "vllm" | "vllm-generate" | "sglang", maxModelLen: number): Promise<Map<string, TrajectoryRecord>> {
  let rt: Runtime | undefined;
  try {
    rt = await buildRuntime({ ...(engine ? { engine } : {}), engineFormat: format, n: N, seed: 7, maxModelLen });
    const b = rt.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
    await b.run.run();
    return new Map(b.run.records().map((r) => [r.key, r]));
  } finally {
    await rt?.close();
  }
}

/** What a trainer reads of a record, without what differs by wire (engine-reported extras, timings). */
function trainerView(r: TrajectoryRecord) {
  return { prompt_ids: r.prompt_ids, response_ids: r.response_ids, response_mask: r.response_mask, rollout_log_probs: r.rollout_log_probs, finish_reason: r.finish_reason, truncated: r.truncated, error: r.error, num_turns: r.num_turns, reward_score: r.reward_score };
}

beforeAll(async () => {
  const sim = await startSimEngine({ script: { ...POLICY, seed: 7 } });
  try {
    reference = await runBatch(sim.urls[0], "vllm", 4096);
  } finally {
    await sim.stop();
  }
  expect(reference.size).toBe(rows.length * N);
  for (const r of reference.values()) expect(r.error).toBeNull();
});

describe("adapters per simulated engine version", () => {
  let sims: RunningSimEngine[] = [];
  afterAll(async () => {
    await Promise.all(sims.map((s) => s.stop()));
  });
  for (const version of SIM_ENGINE_VERSIONS) {
    for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
      test(`vLLM ${version} sim, format ${format}: the records equal the reference`, async () => {
        const sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, wire: { engineVersion: version, apiKey: null } });
        sims.push(sim);
        // SGLang serves one token less of context: give it one more so the budgets agree.
        const got = await runBatch(sim.urls[0], format, format === "sglang" ? 4097 : 4096);
        expect([...got.keys()].sort()).toEqual([...reference.keys()].sort());
        for (const [k, r] of got) expect(trainerView(r)).toEqual(trainerView(reference.get(k)!));
        const endpoint = format === "vllm" ? "/v1/completions" : format === "vllm-generate" ? "/inference/v1/generate" : "/generate";
        expect(new Set(sim.replicas[0]!.engine.requests.map((l) => l.endpoint))).toEqual(new Set([endpoint]));
      });
    }
  }
});
