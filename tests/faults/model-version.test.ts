import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { createAgentExecutor } from "../../shared/rollout/executor.ts";
import { MemoryPolicyVersions } from "../../shared/rollout/policy-version.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { depsFor, ROWS } from "../session/fixtures.ts";

// Row 3 of the example data ("A film festival…") takes three assistant turns (lookup, calc, answer).
const FILM = ROWS[3]!;
let tools: ToolServer;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
});
afterAll(() => tools.stop());

/** A rollouts app whose engine client makes the trainer publish a new policy version after every turn. */
async function setup(maxStaleness: number | null, stalenessPolicy: "admit" | "fail" = "fail") {
  const { deps } = await depsFor(tools.url);
  const policy = new MemoryPolicyVersions();
  let next = 2;
  const bumping: InferenceClient = {
    async generate(req) {
      const out = await deps.client.generate(req);
      void policy.set(`v${next++}`);
      return out;
    },
  };
  const config = parseAppConfig({ rollout: { n: 1, max_model_len: 4096, max_staleness: maxStaleness, staleness_policy: stalenessPolicy } });
  const service = new RolloutService({ config, store: new MemoryTransferQueue(), policy, executorFor: (r, b) => createAgentExecutor({ ...deps, client: bumping, policy }, r, b) });
  const app = createRolloutsApp({ service });
  const post = (path: string, body: unknown) => app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { app, post, service };
}

async function runOne(s: Awaited<ReturnType<typeof setup>>): Promise<TrajectoryRecord> {
  const res = await s.post("/v1/rollouts", { rows: [{ ...FILM, uid: "film" }], model_version: "batch-v" });
  const { batch_id } = (await res.json()) as { batch_id: string };
  const run = s.service.batch(batch_id);
  await run.run();
  return run.records()[0]!;
}

describe("policy versions", () => {
  test("POST /v1/model-version sets the version every later turn records; GET reads it; bad bodies are 400", async () => {
    const s = await setup(null);
    expect(await (await s.app.request("/v1/model-version")).json()).toEqual({ version: null, seq: 0 });
    const set = await s.post("/v1/model-version", { version: "v1" });
    expect(await set.json()).toEqual({ version: "v1", seq: 1 });
    expect(await (await s.post("/v1/model-version", { version: "v1" })).json()).toEqual({ version: "v1", seq: 1 });
    const bad = await s.post("/v1/model-version", { version: "" });
    expect(bad.status).toBe(400);
    expect((await bad.json()).error.field).toBe("version");
    expect((await s.post("/v1/model-version", { version: 3, extra: 1 })).status).toBe(400);
    // A blank version is refused like an empty one, on both version routes.
    for (const path of ["/v1/model-version", "/v1/consumed-version"]) {
      const blank = await s.post(path, { version: "   " });
      expect([blank.status, (await blank.json()).error]).toEqual([400, { code: "invalid_input", field: "version", message: "version: a version must not be empty or blank" }]);
    }

    const rec = await runOne(s);
    expect(rec.error).toBeNull();
    // Each turn is stamped with the version current when its call was sent; the engine client bumps it after each turn.
    expect(rec.extra_fields.model_versions).toEqual(["v1", "v2", "v3"]);
    expect(await (await s.app.request("/v1/model-version")).json()).toEqual({ version: "v4", seq: 4 });
  });

  test("without a published version, turns record the batch's model_version", async () => {
    const { deps } = await depsFor(tools.url);
    const service = new RolloutService({ config: parseAppConfig({ rollout: { n: 1, max_model_len: 4096 } }), store: new MemoryTransferQueue(), executorFor: (r, b) => createAgentExecutor({ ...deps, policy: new MemoryPolicyVersions() }, r, b) });
    const { run } = service.submit({ rows: [{ ...FILM, uid: "film" }], model_version: "batch-v", global_steps: -1, validate: false });
    await run.run();
    expect(run.records()[0]!.extra_fields.model_versions).toEqual(["batch-v", "batch-v", "batch-v"]);
  });

  test("rollout.max_staleness 0 with staleness_policy fail (the old behaviour): a trajectory whose policy moved on since its first turn fails with the reason recorded", async () => {
    // Turn 1 is sent under v1; the engine client then publishes v2, so before turn 2 the trajectory is 1 version behind.
    const s = await setup(0);
    await s.post("/v1/model-version", { version: "v1" });
    const rec = await runOne(s);
    expect(rec.finish_reason).toBe("error");
    expect(rec.error).toBe('StaleTrajectoryError: started at policy version "v1", now "v2": 1 versions behind, over rollout.max_staleness 0');
    expect(rec.response_ids).toEqual([]);

    // Before turn 3 it is 2 versions behind: a limit of 2 lets it finish.
    const lenient = await setup(2);
    await lenient.post("/v1/model-version", { version: "v1" });
    expect((await runOne(lenient)).error).toBeNull();
  });

  test("rollout.max_staleness 0 under the default policy (admit): a running trajectory is never failed for staleness", async () => {
    const s = await setup(0, "admit");
    await s.post("/v1/model-version", { version: "v1" });
    // No consumed version reported: admission does not hold; the policy moves on after every turn and nothing fails.
    const rec = await runOne(s);
    expect(rec.error).toBeNull();
    expect(rec.extra_fields.model_versions).toEqual(["v1", "v2", "v3"]);
    expect(rec.extra_fields.admission).toBeUndefined();
  });
});
