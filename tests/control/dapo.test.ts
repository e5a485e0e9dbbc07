import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { FilteredGroup, CompleteGroup } from "../../shared/store/types.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// DAPO dynamic sampling: a reward webhook scores by key — rows whose uid starts with "mix" get 1 for session 0
// and 0 for session 1 (a group that teaches something); every other row gets 1 for both (all equal: filtered).
// Batch of 10 rows, target 4: rows 0..3 start; each filtered group starts the next reserve row.

const N = 2;
let tok: ChatTokenizer;
let sim: RunningSimEngine;
let rt: Runtime;
let reward: ReturnType<typeof Bun.serve>;
const scored: string[] = [];
beforeAll(async () => {
  tok = await defaultTokenizer();
  reward = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: async (req) => {
      const { key } = (await req.json()) as { key: string };
      scored.push(key);
      const [uid, sid] = key.split("_");
      return Response.json({ score: uid!.startsWith("mix") ? (sid === "0" ? 1 : 0) : 1 });
    },
  });
  sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 1 } });
  const dir = mkdtempSync(join(tmpdir(), "dapo-"));
  const cfg = join(dir, "config.json");
  writeFileSync(cfg, JSON.stringify({ reward: { url: `http://127.0.0.1:${reward.port}/score` } }));
  rt = await buildRuntime({ config: cfg, engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, concurrency: 8 });
});
afterAll(async () => {
  await rt?.close();
  await sim?.stop();
  reward?.stop(true);
});

const row = (i: number, uid: string) => ({ ...ROWS[i]!, uid, reward_model: { style: "webhook", ground_truth: "x" } });

describe("filter_groups (DAPO) inline", () => {
  test("all-equal groups are filtered (not delivered, listed with include_filtered=1), reserve rows replace them until target_groups", async () => {
    // Rows 0,1 all-equal; 2 mixed; 3 all-equal; reserve: 4 all-equal, 5 mixed, 6 mixed, 7..9 mixed (never needed).
    const uids = ["eqa0", "eqa1", "mix2", "eqa3", "eqa4", "mix5", "mix6", "mix7", "mix8", "mix9"];
    const app = createRolloutsApp({ service: rt.service, apiToken: null });
    const res = await app.request("/v1/rollouts", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rows: uids.map((u, i) => row(i, u)), target_groups: 4, config: { rollout: { filter_groups: { metric: "reward", drop_if: "all_equal" } } } }),
    });
    expect(res.status).toBe(202);
    const { batch_id } = (await res.json()) as { batch_id: string };
    const run = rt.service.batch(batch_id);
    await run.run();
    const s = run.stats();
    const o = s.oversample!;
    // Eager 0..3 (3 filtered: eqa0, eqa1, eqa3) → reserve 4 (filtered), 5, 6 → then 7 completes the 4th delivered group.
    expect(o.eager_rows).toBe(4);
    expect(o.filtered).toBe(4);
    expect(o.replacements).toBe(4);
    expect(o.delivered).toBe(4);
    expect(o.reached).toBe(true);
    expect(o.unused_groups).toBe(2);
    expect(o.unused_sessions).toBe(4);
    expect(o.cancelled).toBe(0);
    expect(s.counts.finished).toBe(16);
    expect(s.counts.finished + o.unused_sessions).toBe(s.counts.total);
    // The trainers get exactly the mixed groups; the filtered ones are readable with include_filtered=1.
    const got = (await (await app.request("/v1/groups?max=100&include_filtered=1")).json()) as { groups: CompleteGroup[]; filtered: FilteredGroup[] };
    expect(got.groups.map((g) => g.uid).sort()).toEqual(["mix2", "mix5", "mix6", "mix7"]);
    for (const g of got.groups) expect(g.records.map((r) => r.reward_score)).toEqual([1, 0]);
    expect(got.filtered.map((g) => g.uid).sort()).toEqual(["eqa0", "eqa1", "eqa3", "eqa4"]);
    for (const g of got.filtered) {
      expect(g.reason).toBe("reward all_equal 1");
      expect(g.records.map((r) => r.reward_score)).toEqual([1, 1]);
    }
    expect((await rt.store.groupStatus("eqa0")).filtered).toBe(true);
    expect((await rt.store.groupStatus("eqa0")).complete).toBe(true);
    // Reserve rows never started: no group registered, nothing scored.
    for (const u of ["mix8", "mix9"]) expect((await rt.store.groupStatus(u)).expected).toBeNull();
    expect(scored.some((k) => k.startsWith("mix8") || k.startsWith("mix9"))).toBe(false);
    // Without include_filtered the answer has only groups.
    expect(Object.keys((await (await app.request("/v1/groups?max=1")).json()) as object)).toEqual(["groups"]);
  }, HANG_MS);
});
