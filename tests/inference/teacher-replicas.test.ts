import { afterAll, beforeAll, expect, test } from "bun:test";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { teacherClientsFor } from "../../infra/cli/teacher.ts";
import { simPromptLogProbs } from "../../infra/sim-engine/prompt-logprobs.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";

// rollout.teacher.urls: teacher replicas behind the in-process gateway, routed like engine replicas:
// sticky per trajectory key, and a dead replica's keys fail over to a live one.
let tok: ChatTokenizer;
let sim: RunningSimEngine;
beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ tokenizer: tok, replicas: 2, scoreSeed: 11 });
});
afterAll(() => sim.stop());

test("scoring calls of one key stay on one replica; when it dies they move to the other, same scores", async () => {
  const config = parseAppConfig({ rollout: { teacher: { urls: sim.urls, format: "vllm", timeout_ms: 5_000 } } });
  const client = teacherClientsFor(config, tok)(config.rollout.teacher!);
  expect(client.describe).toBe("vllm at http://teacher-gateway.local");
  const ids = tok.encode("A teacher scores every sampled token of this trajectory.");
  const want = simPromptLogProbs(sim.replicas[0]!.engine, ids).slice(3);
  const served = () => sim.replicas.map((r) => r.engine.requests.filter((q) => q.routing_key === "traj-a_0_0").length);
  for (let i = 0; i < 3; i++) expect(await client.score({ request_id: `r${i}`, routing_key: "traj-a_0_0", prompt_ids: ids.slice(0, 3), response_ids: ids.slice(3) })).toEqual(want as number[]);
  const counts = served();
  expect(counts.sort()).toEqual([0, 3]);
  const pinned = served().indexOf(3);
  await sim.replicas[pinned]!.kill();
  expect(await client.score({ request_id: "r9", routing_key: "traj-a_0_0", prompt_ids: ids.slice(0, 3), response_ids: ids.slice(3) })).toEqual(want as number[]);
  expect(served()[1 - pinned]).toBe(1);
  sim.replicas[pinned]!.revive();
});
