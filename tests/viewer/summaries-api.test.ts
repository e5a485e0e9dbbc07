import { afterAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { groupDivergence } from "../../shared/rollout/group-divergence.ts";
import { summarizeTrajectory } from "../../shared/rollout/trajectory-summary.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { tokenPieces } from "../../shared/telemetry/token-pieces.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { groupRows, writeGroupScript } from "./group-fixture.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// What the viewer's list and group view read, over the real app, on the memory store and on Redis:
// GET /v1/rollouts/{id}/summaries (paged, filtered) and GET /v1/rollouts/{id}/groups/{uid}.
const redis = await requireRedis();
const runtimes: Runtime[] = [];
const prefixes: string[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
  for (const p of prefixes) await deleteByPrefix(p);
});
const SCRIPT = writeGroupScript();
type App = ReturnType<typeof createRolloutsApp>;

async function waitDone(app: App, batchId: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if ((await (await app.request(`/v1/rollouts/${batchId}`)).json()).done) return;
    await Bun.sleep(25);
  }
  throw new Error("batch did not finish");
}

/** Every record of the batch, in the order the NDJSON stream (completion order) gives them. */
async function streamed(app: App, batchId: string): Promise<TrajectoryRecord[]> {
  const text = await (await app.request(`/v1/rollouts/${batchId}/trajectories`)).text();
  return text.trim().split("\n").map((l) => JSON.parse(l));
}

/**
 * Posts three rows × n=4 through `poster`, runs `work` (queue mode: a worker), then reads everything
 * through `app` (another API process in queue mode, which rebuilds the batch from Redis).
 */
async function scenario(app: App, uidPrefix: string, opts: { poster?: App; work?: () => Promise<void> } = {}): Promise<string> {
  const post = await (opts.poster ?? app).request("/v1/rollouts", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ rows: groupRows(3, uidPrefix), config: { rollout: { n: 4 } } }),
  });
  expect(post.status).toBe(202);
  const batchId = (await post.json()).batch_id as string;
  await opts.work?.();
  await waitDone(app, batchId);
  const all = await streamed(app, batchId);
  expect(all.length).toBe(12);

  // Pages of 5: 5 + 5 + 2, in completion order, cursors are positions; summaries carry no token arrays.
  const base = `/v1/rollouts/${batchId}/summaries`;
  const p1 = await (await app.request(`${base}?limit=5`)).json();
  expect(p1).toEqual({ summaries: all.slice(0, 5).map(summarizeTrajectory), next_cursor: "5", total: 12, matched: 12, done: true });
  expect(Object.keys(p1.summaries[0]).sort()).toEqual(["error", "finish_reason", "key", "num_turns", "output_index", "prompt_length", "response_length", "reward_score", "sampled", "session_id", "status", "truncated", "uid"]);
  const p2 = await (await app.request(`${base}?limit=5&cursor=5`)).json();
  expect(p2.summaries.map((s: { key: string }) => s.key)).toEqual(all.slice(5, 10).map((r) => r.key));
  expect(p2.next_cursor).toBe("10");
  const p3 = await (await app.request(`${base}?limit=5&cursor=10`)).json();
  expect(p3.summaries.map((s: { key: string }) => s.key)).toEqual(all.slice(10).map((r) => r.key));
  expect(p3.next_cursor).toBeNull();
  expect((await (await app.request(`${base}?cursor=99`)).json()).summaries).toEqual([]);
  // Following a batch past its last page: cursor=<total> gives what finished since (here nothing).
  expect(await (await app.request(`${base}?cursor=12`)).json()).toEqual({ summaries: [], next_cursor: null, total: 12, matched: 12, done: true });

  // Filters are the server's: reward, uid; the cursor skips past non-matching records.
  const rewarded = all.filter((r) => r.reward_score !== null && r.reward_score >= 0.5);
  expect(rewarded.length).toBe(10);
  const f1 = await (await app.request(`${base}?reward_min=0.5&limit=4`)).json();
  expect(f1.summaries.map((s: { key: string }) => s.key)).toEqual(rewarded.slice(0, 4).map((r) => r.key));
  expect(f1.matched).toBe(10);
  const f2 = await (await app.request(`${base}?reward_min=0.5&limit=4&cursor=${f1.next_cursor}`)).json();
  expect(f2.summaries.map((s: { key: string }) => s.key)).toEqual(rewarded.slice(4, 8).map((r) => r.key));
  const zero = await (await app.request(`${base}?reward_max=0`)).json();
  expect(zero.summaries.map((s: { key: string }) => s.key).sort()).toEqual([`${uidPrefix}-1_0_0`, `${uidPrefix}-1_1_0`]);
  expect((await (await app.request(`${base}?uid=${uidPrefix}-2&status=ok&truncated=0`)).json()).matched).toBe(4);
  expect((await (await app.request(`${base}?status=failed`)).json()).matched).toBe(0);

  // 400s name the parameter.
  for (const [q, field] of [["limit=0", "limit"], ["limit=501", "limit"], ["limit=x", "limit"], ["cursor=-1", "cursor"], ["status=done", "status"], ["truncated=yes", "truncated"], ["reward_min=", "reward_min"], ["reward_max=1e999", "reward_max"], ["uid=a_b", "uid"]] as const) {
    const res = await app.request(`${base}?${q}`);
    expect(res.status).toBe(400);
    expect((await res.json()).error.field).toBe(field);
  }
  expect((await app.request(`/v1/rollouts/00000000-0000-0000-0000-000000000000/summaries`)).status).toBe(404);

  // The group: its four records by session, the divergence of prompt ‖ response, decode=1 adds the text.
  const uid = `${uidPrefix}-2`;
  const g = await (await app.request(`/v1/rollouts/${batchId}/groups/${uid}`)).json();
  const mine = all.filter((r) => r.uid === uid).sort((a, b) => a.session_id - b.session_id);
  expect(g.records).toEqual(mine);
  expect(g.divergence).toEqual(groupDivergence(mine.map((r) => ({ key: r.key, ids: [...r.prompt_ids, ...r.response_ids] }))));
  expect(g.divergence.samples.map((s: { at: number }) => s.at - mine[0]!.prompt_ids.length)).toEqual(g.divergence.samples.map((s: { at: number }) => s.at - 20));
  const dec = await (await app.request(`/v1/rollouts/${batchId}/groups/${uid}?decode=1`)).json();
  const tok = await defaultTokenizer();
  expect(dec.records.map((r: { decoded: unknown }) => r.decoded)).toEqual(mine.map((r) => ({ prompt: tokenPieces(tok, r.prompt_ids), response: tokenPieces(tok, r.response_ids) })));
  const missing = await app.request(`/v1/rollouts/${batchId}/groups/nope`);
  expect(missing.status).toBe(404);
  expect((await missing.json()).error).toEqual({ code: "not_found", message: `batch '${batchId}' has no group 'nope'`, field: "uid" });
  expect((await (await app.request(`/v1/rollouts/${batchId}/groups/a_b`)).json()).error.field).toBe("uid");
  expect((await (await app.request(`/v1/rollouts/${batchId}/groups/${uid}?decode=2`)).json()).error.field).toBe("decode");
  return batchId;
}

/** The `curl … localhost:8787/v1/…` URLs of a doc that read a batch's summaries or groups, as paths. */
function documentedPaths(file: string): string[] {
  const text = readFileSync(join(import.meta.dir, "..", "..", file), "utf8");
  return [...text.matchAll(/curl -s "?localhost:8787(\/v1\/rollouts\/\$BATCH_ID\/(?:summaries|groups)[^"\s]*)"?/g)].map((m) => m[1]!);
}

describe("the viewer's paged list and group API", () => {
  test("memory store", async () => {
    const rt = await buildRuntime({ n: 1, seed: 1, script: SCRIPT });
    runtimes.push(rt);
    const app = createRolloutsApp({ service: rt.service });
    const batchId = await scenario(app, "grp");
    // The examples of docs/viewer.md and the README answer 200 as written.
    const paths = [...documentedPaths("docs/viewer.md"), ...documentedPaths("README.md")];
    expect(paths.length).toBe(5);
    for (const p of paths) {
      const res = await app.request(p.replaceAll("$BATCH_ID", batchId).replaceAll("$GROUP_UID", "grp-0").replaceAll("$NEXT", "3"));
      expect([p, res.status]).toEqual([p, 200]);
    }
  }, HANG_MS);
  test.skipIf(!redis)("Redis store (durable sessions)", async () => {
    const prefix = randomPrefix("viewer-summaries");
    prefixes.push(prefix);
    const rt = await buildRuntime({ n: 1, seed: 1, script: SCRIPT, store: REDIS_URL, storePrefix: prefix });
    runtimes.push(rt);
    await scenario(createRolloutsApp({ service: rt.service }), "grp");
  }, HANG_MS);
  test.skipIf(!redis)("Redis queue mode: a worker runs the jobs, another API process pages the batch it rebuilds from Redis", async () => {
    const prefix = randomPrefix("viewer-summaries-q");
    prefixes.push(prefix);
    const flags = { n: 1, seed: 1, script: SCRIPT, store: REDIS_URL, storePrefix: prefix };
    const api = await buildRuntime(flags, { jobs: "queue" });
    const worker = await buildRuntime(flags);
    const reader = await buildRuntime(flags, { jobs: "queue" });
    runtimes.push(api, worker, reader);
    const work = async () => {
      const s = await new JobWorker({ model: null, jobs: worker.jobs!, store: worker.batchStore, executorFor: worker.executorFor, consumer: "vw", concurrency: 4, idleExitMs: 500, blockMs: 100 }).run();
      expect(s).toMatchObject({ claimed: 12, completed: 12, failed: 0 });
    };
    await scenario(createRolloutsApp({ service: reader.service }), "grp", { poster: createRolloutsApp({ service: api.service }), work });
  }, HANG_MS);
});
