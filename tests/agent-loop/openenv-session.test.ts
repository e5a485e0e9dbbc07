import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { OpenEnvAgentLoop } from "../../shared/agent-loop/openenv-agent.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { OpenEnvSettings, type OpenEnvSettingsInput } from "../../shared/schema/openenv.ts";
import type { SessionCheckpoint, SessionInputArg } from "../../shared/session/checkpoint.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { DyingStorage } from "../helpers/dying-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, ctxOf, IM_END, maskRuns, ScriptedClient, type Script } from "./helpers.ts";
import { startOpenEnvServer, type OpenEnvTestServer } from "./openenv-server.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startSandboxProvider } from "../../infra/sandbox/provider.ts";
import { SandboxSpec } from "../../shared/schema/index.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import { SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";

const hasRedis = await requireRedis();

// Durable sessions run openenv_agent as tool_agent's state machine: a step whose result was committed is never sent again.

let tok: ChatTokenizer;
const servers: OpenEnvTestServer[] = [];
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()));
});


const rollout = config();
const input = (): SessionInputArg => ({
  key: "s1_0_0",
  agent_name: "openenv_agent",
  sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true },
  kwargs: { uid: "s1", session_id: 0, key: "s1_0_0", prompt: [{ role: "user", content: "Play." }], extra_info: { openenv: { reset_kwargs: { seed: 6 } } } },
  rollout,
  model_version: null,
});

function deps(storage: SessionStorage, client: InferenceClient, over: OpenEnvSettingsInput, commits?: SessionCheckpoint[]): SessionDeps {
  return {
    storage,
    createLoop: (inp) => new OpenEnvAgentLoop(ctxOf(tok, client, inp.rollout, { openenv: { settings: OpenEnvSettings.parse(over) } })),
    ...(commits ? { onCommit: (cp: SessionCheckpoint) => commits.push(structuredClone(cp)) } : {}),
  };
}

const script = (...guesses: string[]): Script[] => guesses.map((text) => ({ text }));

describe("openenv_agent as a durable session", () => {
  test("every transition is a commit; the output equals the in-process run's", async () => {
    const env = startOpenEnvServer();
    servers.push(env);
    const commits: SessionCheckpoint[] = [];
    const s = (await TrajectorySession.open("s1_0_0", deps(new MemorySessionStorage(), new ScriptedClient(tok, script("5", "8", "7")), { base_url: env.url, transport: "http" }, commits), input()))!;
    const r = await s.run();
    expect(r.status).toBe("finished");
    expect(commits.map((c) => `${c.step}:${c.phase}:${c.loop_state}`)).toEqual([
      "0:running:generating",
      "1:running:processing_tools",
      "2:running:generating",
      "3:running:processing_tools",
      "4:running:generating",
      "5:running:processing_tools",
      "6:running:terminated",
      "7:finished:terminated",
    ]);
    const o = (r as { outputs: AgentLoopOutput[] }).outputs[0]!;
    expect(o.extra_fields).toMatchObject({ turn_scores: [-0.25, -0.25, 1], env_steps: 3, terminated_by: "env_done" });
    expect(o.reward_score).toBe(0.5);
    expect(env.steps()).toBe(3);
  });

  test("HTTP: a crash after a committed step resumes without sending that step again", async () => {
    const env = startOpenEnvServer();
    servers.push(env);
    const inner = new MemorySessionStorage();
    // Appends 1..5 commit reset, turn 1, step 1, turn 2, step 2; the 6th (turn 3) dies.
    const first = (await TrajectorySession.open("s1_0_0", deps(new DyingStorage(inner, 6), new ScriptedClient(tok, script("5", "8", "7")), { base_url: env.url, transport: "http" }), input()))!;
    expect(await first.run().catch((e: Error) => e.message)).toBe("killed");
    expect(env.steps()).toBe(2);
    // Another process resumes from the checkpoint: turn 3 is generated again (it was not committed), then stepped once.
    const resumedClient = new ScriptedClient(tok, script("7"));
    const again = (await TrajectorySession.open("s1_0_0", deps(inner, resumedClient, { base_url: env.url, transport: "http" })))!;
    const r = await again.run();
    expect(r.status).toBe("finished");
    expect(env.steps()).toBe(3);
    expect(env.log.http.map((h) => h.path)).toEqual(["/reset", "/step", "/step", "/step"]);
    expect(resumedClient.requests.length).toBe(1);
    const o = (r as { outputs: AgentLoopOutput[] }).outputs[0]!;
    expect(o.extra_fields).toMatchObject({ turn_scores: [-0.25, -0.25, 1], env_steps: 3, terminated_by: "env_done" });
    expect(maskRuns(o).filter(([m]) => m === 1).map(([, ids]) => ids)).toEqual([[...tok.encode("5"), IM_END], [...tok.encode("8"), IM_END], [...tok.encode("7"), IM_END]]);
  });

  test("HTTP: a crash between a step and its commit re-sends that one step, with the same request_id", async () => {
    // OpenEnv servers do not dedupe steps: this one counts the repeated guess as an attempt (5 allowed).
    const env = startOpenEnvServer({ maxAttempts: 5 });
    servers.push(env);
    const inner = new MemorySessionStorage();
    // The 5th append (step 2's result and observation) dies after the step was sent.
    const first = (await TrajectorySession.open("s1_0_0", deps(new DyingStorage(inner, 5), new ScriptedClient(tok, script("5", "8")), { base_url: env.url, transport: "http" }), input()))!;
    expect(await first.run().catch((e: Error) => e.message)).toBe("killed");
    const again = (await TrajectorySession.open("s1_0_0", deps(inner, new ScriptedClient(tok, script("7")), { base_url: env.url, transport: "http" })))!;
    const r = await again.run();
    expect(r.status).toBe("finished");
    const steps = env.log.http.filter((h) => h.path === "/step").map((h) => h.body);
    expect(steps).toEqual([
      { action: { message: "5" }, request_id: "s1_0_0:1" },
      { action: { message: "8" }, request_id: "s1_0_0:2" },
      { action: { message: "8" }, request_id: "s1_0_0:2" },
      { action: { message: "7" }, request_id: "s1_0_0:3" },
    ]);
    // The record holds one score per committed step: the re-sent step's result took the lost one's place.
    const o = (r as { outputs: AgentLoopOutput[] }).outputs[0]!;
    expect(o.extra_fields).toMatchObject({ turn_scores: [-0.25, -0.25, 1], env_steps: 3 });
  });

  test("WebSocket: a resumed session cannot continue the episode of a lost connection and fails, saying so", async () => {
    const env = startOpenEnvServer();
    servers.push(env);
    const inner = new MemorySessionStorage();
    const first = (await TrajectorySession.open("s1_0_0", deps(new DyingStorage(inner, 3), new ScriptedClient(tok, script("5")), { base_url: env.url }), input()))!;
    expect(await first.run().catch((e: Error) => e.message)).toBe("killed");
    const client = new ScriptedClient(tok, script("8"));
    const again = (await TrajectorySession.open("s1_0_0", deps(inner, client, { base_url: env.url })))!;
    const r = await again.run();
    expect(r).toEqual({
      status: "failed",
      error: `OpenEnvError: openenv ${env.url}: the trajectory resumed from a checkpoint, but its WebSocket episode lived in the connection of the process that started it; an OpenEnv WebSocket episode cannot be continued (use transport http with a server that keeps episode state to resume)`,
    });
    // Nothing was sent: neither the engine nor the environment saw the resumed session.
    expect(client.requests).toEqual([]);
    expect(env.log.ws.filter((w) => (w.msg as { type: string }).type === "step").length).toBe(1);
  });

  test.skipIf(!hasRedis)("base_url sandbox, HTTP: a session resumed by another process (its own lease manager on the shared Redis lease store) plays the same sandbox's episode", async () => {
    const provider = startSandboxProvider({ openenv: true, idPrefix: "sbx-" });
    const prefix = randomPrefix("oe-sbx");
    const commanders = [new IoRedisCommander(REDIS_URL), new IoRedisCommander(REDIS_URL)];
    const spec = SandboxSpec.parse({ create_url: `${provider.url}/sandboxes/create`, release_url: `${provider.url}/sandboxes/release`, ttl_s: 30 });
    const [a, b] = commanders.map((c) => new SandboxLeases(spec, new RedisLeaseStore(c, { prefix }), { trajectoryDeadlineS: 600 }));
    const sandboxDeps = (storage: SessionStorage, client: InferenceClient, leases: SandboxLeases): SessionDeps => ({
      storage,
      createLoop: (inp) => new OpenEnvAgentLoop(ctxOf(tok, client, inp.rollout, { openenv: { settings: OpenEnvSettings.parse({ base_url: "sandbox", transport: "http", observation: { field: "prompt" } }) }, leases })),
    });
    try {
      const inner = new MemorySessionStorage();
      // Appends 1..5 commit reset, turn 1, step 1, turn 2, step 2; the 6th (turn 3) dies.
      const first = (await TrajectorySession.open("s1_0_0", sandboxDeps(new DyingStorage(inner, 6), new ScriptedClient(tok, script("5", "8", "7")), a!), input()))!;
      expect(await first.run().catch((e: Error) => e.message)).toBe("killed");
      expect(a!.leaseOf("s1_0_0")).toEqual({ lease_id: "s1_0_0~1", sandbox_id: "sbx-1", base_url: `${provider.url}/envs/sbx-1` });
      expect(b!.leaseOf("s1_0_0")).toBeUndefined();
      const again = (await TrajectorySession.open("s1_0_0", sandboxDeps(inner, new ScriptedClient(tok, script("7")), b!)))!;
      const r = await again.run();
      expect(r.status).toBe("finished");
      // The second process found the lease (and its base_url) in the store: no second sandbox, the episode went on.
      expect(b!.leaseOf("s1_0_0")).toEqual({ lease_id: "s1_0_0~1", sandbox_id: "sbx-1", base_url: `${provider.url}/envs/sbx-1` });
      expect(provider.stats()).toMatchObject({ created: 1, live: 1, env_requests: { reset: 1, step: 3 } });
      const o = (r as { outputs: AgentLoopOutput[] }).outputs[0]!;
      // The example env (seed 6: the number is 7): 5 → Higher, 8 → Lower, 7 → correct.
      expect(o.extra_fields).toMatchObject({ turn_scores: [-0.1, -0.1, 1], env_steps: 3, terminated_by: "env_done", openenv: { url: `${provider.url}/envs/sbx-1`, transport: "http" } });
      expect(await b!.release("s1_0_0", "finished")).toBe(true);
      expect(provider.stats()).toMatchObject({ created: 1, live: 0, releases: 1 });
    } finally {
      await provider.stop();
      for (const c of commanders) await c.close();
      await deleteByPrefix(prefix);
    }
  });
});
