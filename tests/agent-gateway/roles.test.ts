/**
 * A policy per agent role (issue 30 item 7): calls carrying `X-Agent-Role`
 * (or the task's `agent_role`) are served by their role's engine pool —
 * two in-process simulated engines playing different scripts, so the token
 * ids recorded prove which pool served each call — over real HTTP (the
 * gateway app on `Bun.serve`, loopback) with the official `openai` SDK; the
 * records carry `agent_role` and `served_model`, and the queue delivers per
 * role. Then the config (`engine.pools`, `agent.roles`) through the CLI's
 * runtime, and its errors naming the field.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentGateway, type AgentGatewayOptions } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { toTrajectoryRecord } from "../../shared/rollout/batch.ts";
import type { PlannedTrajectory } from "../../shared/rollout/batch.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { validateRecord } from "../../shared/store/record-codec.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import type { ChatMessage, TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const policy = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const TOKEN = "tok_0123456789abcdef0123";
const IM_END = 151645;
const NOW = 1_700_000_000_000;
const PLAN = "Plan: multiply 12 by 3, then subtract 5.";
const SOLVE = "The answer is 31.\n#### 31";
/** The observation ids of the user turn "Shorter, please." after a sampled turn (its `<|im_end|>`), decoded. */
const OBS_TEXT = "\n<|im_start|>user\nShorter, please.<|im_end|>\n<|im_start|>assistant\n";
const PROMPT: ChatMessage[] = [{ role: "user", content: "Ana bakes 12 loaves a day for 3 days and gives away 5. How many loaves are left?" }];

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

/** A sim engine client that keeps every request's prompt ids (which pool was called, with what). */
class Recording implements InferenceClient {
  readonly prompts: number[][] = [];
  readonly keys: string[] = [];
  readonly inner: SimEngineClient;
  constructor(script: unknown) {
    this.inner = new SimEngineClient(new SimEngine({ tokenizer: tok, script }));
  }
  async generate(req: GenerateRequest) {
    this.prompts.push(Array.from(req.prompt_ids));
    this.keys.push(req.routing_key ?? "");
    return this.inner.generate(req);
  }
  async maxModelLen() {
    return this.inner.maxModelLen();
  }
}

/** The gateway app on a loopback port with a default engine and pools `pool_a` (planner script) and `pool_b` (solver script). */
function setup(o: Partial<AgentGatewayOptions> = {}) {
  const def = new Recording(policy);
  const a = new Recording({ default: [PLAN] });
  const b = new Recording({ default: [SOLVE] });
  const gw = new AgentGateway({
    storage: new MemorySessionStorage(),
    tokenizer: tok,
    client: def,
    maxModelLen: 4096,
    wallClockMs: () => NOW,
    pools: { pool_a: { client: a, modelName: "planner-policy" }, pool_b: { client: b } },
    roles: { planner: "pool_a", solver: "pool_b" },
    ...o,
  });
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createAgentGatewayApp({ gateway: gw }).fetch });
  servers.push(server);
  const base = (key: string) => `http://127.0.0.1:${server.port}/v1/sessions/${key}/openai/v1`;
  const sdk = (key: string, role?: string) => new OpenAI({ baseURL: base(key), apiKey: TOKEN, maxRetries: 0, ...(role ? { defaultHeaders: { "X-Agent-Role": role } } : {}) });
  return { gw, def, a, b, sdk, port: server.port };
}
const servers: { stop(force?: boolean): void }[] = [];
afterAll(() => {
  for (const s of servers) s.stop(true);
});

/** Creates session `key` ({uid}_{session_id}_0), of role `agentRole` when given; `now`: its creation, epoch ms (the gateway's clock). */
function create(gw: AgentGateway, key: string, agentRole?: string, now = NOW) {
  return gw.create({
    v: 1,
    key,
    uid: key.split("_")[0]!,
    session_id: Number(key.split("_")[1]),
    token: TOKEN,
    created_ms: now,
    deadline_ms: now + 600_000,
    sampling_params: SP,
    rollout: config(),
    tools: [],
    messages: PROMPT,
    ...(agentRole !== undefined ? { agent_role: agentRole } : {}),
  });
}

/** The session's outputs as queue records (what the `openai_agent` loop's trajectory becomes), checked by the queue's validator. */
async function recordsOf(gw: AgentGateway, key: string): Promise<TrajectoryRecord[]> {
  const st = (await gw.get(key))!;
  const t = { key, uid: st.input.uid, session_id: st.input.session_id, row: { data_source: "roles", prompt: PROMPT }, trajectory_info: {} } as unknown as PlannedTrajectory;
  return agentOutputs(st, { reward: 1 }).map((o, i) => validateRecord(toTrajectoryRecord(t, "openai_agent", o, config(), i)));
}

/** The name of a reply's first (function) tool call. */
const toolName = (r: OpenAI.ChatCompletion) => (r.choices[0]!.message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall | undefined)?.function.name;

const render = (messages: ChatMessage[]) => tok.renderIds(messages, { addGenerationPrompt: true });

describe("agent roles routed to engine pools", () => {
  test("planner then solver in one session: each call served by its role's pool, each output its own role's tokens and record fields", async () => {
    const { gw, def, a, b, sdk } = setup();
    await create(gw, "r1_0_0");
    const planner = sdk("r1_0_0", "planner");
    const solver = sdk("r1_0_0", "solver");
    const p1 = await planner.chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
    expect(p1.choices[0]!.message.content).toBe(PLAN);
    // The solver gets the plan as context: another role, so a new output (a fresh render), never a continuation of the planner's.
    const solverMsgs: ChatMessage[] = [...PROMPT, { role: "assistant", content: PLAN }, { role: "user", content: "Carry out the plan." }];
    const s1 = await solver.chat.completions.create({ model: "qwen3", messages: solverMsgs as OpenAI.ChatCompletionMessageParam[] });
    expect(s1.choices[0]!.message.content).toBe(SOLVE);
    // Back to the planner, continuing its own conversation: its output (0) goes on in place (a leaf of the
    // session's tree, of the planner's role); the solver's output in between is never a candidate.
    const plannerMsgs: ChatMessage[] = [...PROMPT, { role: "assistant", content: PLAN }, { role: "user", content: "The solver says 31. Done?" }];
    const p2 = await planner.chat.completions.create({ model: "qwen3", messages: plannerMsgs as OpenAI.ChatCompletionMessageParam[] });
    expect(p2.choices[0]!.message.content).toBe(PLAN);

    expect(def.prompts).toEqual([]);
    expect(a.prompts).toEqual([render(PROMPT), render(plannerMsgs)]);
    expect(b.prompts).toEqual([render(solverMsgs)]);
    // Sticky per session within each pool: the session key is the routing key.
    expect([...a.keys, ...b.keys]).toEqual(["r1_0_0", "r1_0_0", "r1_0_0"]);

    const recs = await recordsOf(gw, "r1_0_0");
    expect(recs.map((r) => [r.key, r.agent_role, r.served_model, r.parent_key ?? null])).toEqual([
      ["r1_0_0", "planner", "planner-policy", null],
      ["r1_0_1", "solver", "pool_b", null],
    ]);
    const plan = [...tok.encode(PLAN), IM_END];
    const obs = render(plannerMsgs).slice(render(PROMPT).length + plan.length);
    expect(recs.map((r) => r.prompt_ids)).toEqual([render(PROMPT), render(solverMsgs)]);
    expect(recs.map((r) => r.response_ids)).toEqual([[...plan, ...obs, ...plan], [...tok.encode(SOLVE), IM_END]]);
    expect(recs.map((r) => r.response_mask)).toEqual([[...plan.map(() => 1 as const), ...obs.map(() => 0 as const), ...plan.map(() => 1 as const)], [...tok.encode(SOLVE), IM_END].map(() => 1 as const)]);
  });

  test("one role's multi-turn conversation continues its output; the same body under another role is another call, not a replay", async () => {
    const { gw, a, b, sdk } = setup();
    await create(gw, "r2_0_0");
    const planner = sdk("r2_0_0", "planner");
    await planner.chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
    const more: ChatMessage[] = [...PROMPT, { role: "assistant", content: PLAN }, { role: "user", content: "Shorter, please." }];
    await planner.chat.completions.create({ model: "qwen3", messages: more as OpenAI.ChatCompletionMessageParam[] });
    // A retry of the first call's body under the solver role: not the planner's reply again, the solver's pool samples.
    const s = await sdk("r2_0_0", "solver").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] }, { headers: { "x-stainless-retry-count": "1" } });
    expect(s.choices[0]!.message.content).toBe(SOLVE);
    expect([a.prompts.length, b.prompts.length]).toEqual([2, 1]);
    const recs = await recordsOf(gw, "r2_0_0");
    expect(recs.map((r) => [r.agent_role, r.num_turns])).toEqual([["planner", 4], ["solver", 2]]);
    // The planner's output: its two sampled turns (mask 1) around the user turn encoded incrementally (mask 0).
    const act = [...tok.encode(PLAN), IM_END];
    const r0 = recs[0]!;
    const obs = r0.response_ids.slice(act.length, r0.response_ids.length - act.length);
    expect(r0.response_ids).toEqual([...act, ...obs, ...act]);
    expect(r0.response_mask).toEqual([...act.map(() => 1 as const), ...obs.map(() => 0 as const), ...act.map(() => 1 as const)]);
    expect(tok.decode(obs)).toBe(OBS_TEXT);
    expect(recs[1]!.prompt_ids).toEqual(render(PROMPT));
  });

  test("the Responses and Messages APIs of the session carry the role too; GET /models names the role's model", async () => {
    const { gw, def, a, b, sdk, port } = setup();
    await create(gw, "r6_0_0");
    const r = await sdk("r6_0_0", "planner").responses.create({ model: "qwen3", input: PROMPT[0]!.content as string });
    expect(r.output_text).toBe(PLAN);
    const claude = new Anthropic({ baseURL: `http://127.0.0.1:${port}/v1/sessions/r6_0_0/anthropic`, apiKey: TOKEN, maxRetries: 0, defaultHeaders: { "X-Agent-Role": "solver" } });
    const m = await claude.messages.create({ model: "qwen3", max_tokens: 256, messages: [{ role: "user", content: PROMPT[0]!.content as string }] });
    expect(m.content).toEqual([{ type: "text", text: SOLVE, citations: null }]);
    expect([def.prompts.length, a.prompts, b.prompts]).toEqual([0, [render(PROMPT)], [render(PROMPT)]]);
    expect((await recordsOf(gw, "r6_0_0")).map((x) => [x.agent_role, x.served_model, x.response_ids])).toEqual([
      ["planner", "planner-policy", [...tok.encode(PLAN), IM_END]],
      ["solver", "pool_b", [...tok.encode(SOLVE), IM_END]],
    ]);
    expect((await sdk("r6_0_0", "planner").models.list()).data.map((x) => x.id)).toEqual(["planner-policy"]);
    expect((await sdk("r6_0_0").models.list()).data.map((x) => x.id)).toEqual(["qwen3"]);
  });

  test("an unknown role is a 400 naming X-Agent-Role and the known roles; no engine is called", async () => {
    const { gw, def, a, b, sdk } = setup();
    await create(gw, "r3_0_0");
    const err = await sdk("r3_0_0", "critic").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).error).toEqual({
      code: "invalid_input",
      field: "X-Agent-Role",
      message: 'X-Agent-Role: unknown agent role "critic"; known roles: "planner", "solver"',
      type: "invalid_request_error",
      param: "X-Agent-Role",
    });
    const bad = await sdk("r3_0_0", "no spaces").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] }).catch((e: unknown) => e);
    expect((bad as InstanceType<typeof OpenAI.BadRequestError>).error).toEqual({
      code: "invalid_input",
      field: "X-Agent-Role",
      message: `X-Agent-Role: an agent role may only hold letters, digits, '.', '_' and '-', got "no spaces"`,
      type: "invalid_request_error",
      param: "X-Agent-Role",
    });
    // Names of Object.prototype's own properties are no configured roles either (a fresh-user trial got 200 for them).
    for (const role of ["__proto__", "constructor", "toString", "hasOwnProperty"]) {
      const e = await sdk("r3_0_0", role).chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] }).catch((x: unknown) => x);
      expect((e as InstanceType<typeof OpenAI.BadRequestError>).error).toMatchObject({ field: "X-Agent-Role", message: `X-Agent-Role: unknown agent role "${role}"; known roles: "planner", "solver"` });
      expect(gw.modelNameFor(role)).toBe("qwen3");
    }
    expect([def.prompts.length, a.prompts.length, b.prompts.length]).toEqual([0, 0, 0]);
    expect((await gw.get("r3_0_0"))!.outputs.length).toBe(0);
  });

  test("the task's agent_role is the role of calls without the header; the header overrides it; an unknown one is refused at create", async () => {
    const { gw, def, a, b, sdk } = setup();
    await create(gw, "r4_0_0", "solver");
    const r = await sdk("r4_0_0").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
    expect(r.choices[0]!.message.content).toBe(SOLVE);
    const more: ChatMessage[] = [...PROMPT, { role: "assistant", content: SOLVE }, { role: "user", content: "Plan it instead." }];
    await sdk("r4_0_0", "planner").chat.completions.create({ model: "qwen3", messages: more as OpenAI.ChatCompletionMessageParam[] });
    expect([def.prompts.length, a.prompts.length, b.prompts.length]).toEqual([0, 1, 1]);
    expect((await recordsOf(gw, "r4_0_0")).map((x) => [x.agent_role, x.served_model])).toEqual([["solver", "pool_b"], ["planner", "planner-policy"]]);
    expect(gw.modelNameFor("planner")).toBe("planner-policy");
    const err = await create(gw, "r4_1_0", "critic").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InputError);
    expect((err as InputError).field).toBe("agent_role");
    expect((err as InputError).message).toBe('agent_role: unknown agent role "critic"; known roles: "planner", "solver"');
    expect(await gw.get("r4_1_0")).toBeNull();
  });

  test("openai_agent: a row's agent_role goes into the session and the task (model: its pool's); the agent's header overrides it per call", async () => {
    const { gw, a, b, port } = setup();
    const tasks: AgentTask[] = [];
    const runs: Promise<void>[] = [];
    // The test agent: answers 202 and, in the background, calls once as the task's role and once as the planner, then finishes.
    const agentFetch = (async (_u: string | URL | Request, init?: RequestInit) => {
      const task = AgentTask.parse(JSON.parse(String(init!.body)));
      tasks.push(task);
      runs.push(
        (async () => {
          const own = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, maxRetries: 0 });
          await own.chat.completions.create({ model: task.model, messages: task.messages as OpenAI.ChatCompletionMessageParam[] });
          await own.chat.completions.create({ model: task.model, messages: [...task.messages, { role: "user", content: "Plan first." }] as OpenAI.ChatCompletionMessageParam[] }, { headers: { "X-Agent-Role": "planner" } });
          await fetch(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}`, "content-type": "application/json" }, body: JSON.stringify({ reward: 1 }) });
        })(),
      );
      return new Response(null, { status: 202 });
    }) as typeof fetch;
    const link: AgentGatewayLink = { gateway: gw, publicUrl: () => `http://127.0.0.1:${port}`, agent: { url: "http://agent.local/tasks", timeout_ms: 600_000, secret: null }, fetch: agentFetch };
    const loop = new OpenAIAgentLoop(ctxOf(tok, a, config(), { reward: false, agentGateway: link, asyncTools: { wallClockMs: () => NOW } }));
    const outs = await loop.run(SP, { uid: "oa", session_id: 0, prompt: PROMPT, agent_role: "solver" });
    await Promise.all(runs);
    expect(tasks.map((t) => [t.key, t.agent_role, t.model])).toEqual([["oa_0_0", "solver", "pool_b"]]);
    expect(outs.map((o) => [o.agent_role, o.served_model, o.response_ids, o.reward_score])).toEqual([
      ["solver", "pool_b", [...tok.encode(SOLVE), IM_END], 1],
      ["planner", "planner-policy", [...tok.encode(PLAN), IM_END], 1],
    ]);
    expect([a.prompts.length, b.prompts.length]).toEqual([1, 1]);
    // A malformed row role fails the trajectory naming the field, before any session exists.
    const bad = await loop.run(SP, { uid: "ob", session_id: 0, prompt: PROMPT, agent_role: 7 }).catch((e: unknown) => e);
    expect([(bad as InputError).field, (bad as Error).message]).toEqual(["agent_role", "agent_role: Invalid input: expected string, received number, got 7"]);
  });

  test("no roles configured: a role is accepted, served by the default engine and recorded; no role records nothing new", async () => {
    const { gw, def, sdk } = setup({ pools: {}, roles: {} });
    await create(gw, "r5_0_0");
    await create(gw, "r5_1_0");
    const r = await sdk("r5_0_0", "anyone").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
    await sdk("r5_1_0").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
    expect(toolName(r)).toBe("calc");
    expect(def.prompts).toEqual([render(PROMPT), render(PROMPT)]);
    const [withRole] = await recordsOf(gw, "r5_0_0");
    const [plain] = await recordsOf(gw, "r5_1_0");
    expect([withRole!.agent_role, withRole!.served_model]).toEqual(["anyone", "qwen3"]);
    expect("agent_role" in plain! || "served_model" in plain!).toBe(false);
    expect(withRole!.response_ids).toEqual(plain!.response_ids);
  });
});

/** One group `g1` of two sessions: session 0 a planner and a solver output, session 1 a solver output and a failed record (no role). */
async function fillQueue(q: TransferQueue) {
  const { gw, sdk } = setup();
  await create(gw, "g1_0_0");
  await create(gw, "g1_1_0", "solver");
  await sdk("g1_0_0", "planner").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
  await sdk("g1_0_0", "solver").chat.completions.create({ model: "qwen3", messages: [...PROMPT, { role: "user", content: "Solve." }] as OpenAI.ChatCompletionMessageParam[] });
  await sdk("g1_1_0").chat.completions.create({ model: "qwen3", messages: PROMPT as OpenAI.ChatCompletionMessageParam[] });
  await q.expectGroup("g1", 2);
  const s0 = await recordsOf(gw, "g1_0_0");
  for (const [i, r] of s0.entries()) await q.put(r, { last: i === s0.length - 1 });
  for (const r of await recordsOf(gw, "g1_1_0")) await q.put(r, { last: false });
  await q.markFailed("g1_1_1", "engine: boom");
}

describe("per-role delivery from the transfer queue", () => {
  test("memory queue: agent_role keeps only that role's records of each delivered group (failed counted over them)", async () => {
    const q = new MemoryTransferQueue();
    await fillQueue(q);
    const [g] = await q.readCompleteGroups({ consumer: "c", max: 4, agent_role: "solver" });
    expect(g!.records.map((r) => [r.key, r.agent_role, r.served_model, r.response_ids.length])).toEqual([
      ["g1_0_1", "solver", "pool_b", tok.encode(SOLVE).length + 1],
      ["g1_1_0", "solver", "pool_b", tok.encode(SOLVE).length + 1],
    ]);
    expect([g!.uid, g!.failed]).toEqual(["g1", 0]);
    expect(await q.ack([g!.delivery_id])).toBe(1);
    expect(() => q.readCompleteGroups({ consumer: "c", max: 4, agent_role: "" })).toThrow("agent_role: an agent role must not be empty");
  });

  test("Redis: one consumer group per role, each trainer gets every group with its role's records; without a filter, all four", async () => {
    if (!(await requireRedis())) return;
    const prefix = randomPrefix("roles");
    const queues = ["planners", "solvers", "trainers"].map((group) => createRedisTransferQueue({ url: REDIS_URL, prefix, group }));
    try {
      await fillQueue(queues[2]!);
      const [p, s, all] = await Promise.all([
        queues[0]!.readCompleteGroups({ consumer: "p0", max: 4, agent_role: "planner" }),
        queues[1]!.readCompleteGroups({ consumer: "s0", max: 4, agent_role: "solver" }),
        queues[2]!.readCompleteGroups({ consumer: "t0", max: 4 }),
      ]);
      expect(p.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([["g1", ["g1_0_0"]]]);
      expect(s.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([["g1", ["g1_0_1", "g1_1_0"]]]);
      expect(all.map((g) => [g.failed, g.records.map((r) => [r.key, r.agent_role ?? null])])).toEqual([[1, [["g1_0_0", "planner"], ["g1_0_1", "solver"], ["g1_1_0", "solver"], ["g1_1_1", null]]]]);
      expect(p[0]!.records[0]!.response_ids).toEqual([...tok.encode(PLAN), IM_END]);
      expect(p[0]!.delivery_id).toBe(s[0]!.delivery_id);
      expect(await queues[0]!.ack([p[0]!.delivery_id])).toBe(1);
      expect(await queues[1]!.ack([s[0]!.delivery_id])).toBe(1);
    } finally {
      for (const q of queues) await q.close();
      await deleteByPrefix(prefix);
    }
  });
});

describe("config: engine.pools and agent.roles", () => {
  test("errors name the field", () => {
    const msg = (raw: unknown) => {
      try {
        parseAppConfig(raw);
        return "ok";
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError);
        return `${(e as ConfigError).field} | ${(e as Error).message}`;
      }
    };
    expect(msg({ engine: { pools: { pool_a: {} } }, agent: { roles: { planner: "pool_a", solver: "x" } } })).toBe(
      'agent.roles.solver | config agent.roles.solver: unknown pool "x" (known pools: "default", "pool_a"; "default" is the engine section, the others engine.pools) (in config)',
    );
    expect(msg({ engine: { pools: { default: {} } } })).toBe('engine.pools.default | config engine.pools.default: must not be named "default": that is the engine section itself (name the pool otherwise) (in config)');
    expect(msg({ engine: { pools: { "a b": {} } } })).toBe("engine.pools.a b | config engine.pools.a b: a pool name is 1 to 64 characters of letters, digits, '.', '_' and '-' (in config)");
    expect(msg({ agent: { roles: { "a/b": "default" } } })).toBe("agent.roles.a/b | config agent.roles.a/b: an agent role may only hold letters, digits, '.', '_' and '-' (in config)");
    expect(msg({ engine: { pools: { a: { url: "http://127.0.0.1:9", script: "s.json" } } } })).toBe('engine.pools.a.script | config engine.pools.a.script: engine.pools.*.script applies to the simulated engine only (engine.url "sim"), not to http://127.0.0.1:9 (in config)');
    expect(msg({ engine: { pools: { a: { replicas: "two" } } } })).toBe("engine.pools.a.replicas | config engine.pools.a.replicas: Invalid input: expected number, received string (in config)");
    // The default single-pool config is unchanged: no pools, no roles.
    const c = parseAppConfig({});
    expect([c.engine.pools, c.agent.roles]).toEqual([null, null]);
    expect(() => new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new Recording(policy), roles: { planner: "nope" } })).toThrow('config agent.roles.planner: unknown pool "nope" (known pools: "default")');
  });

  test("the CLI runtime builds each pool from its section and routes roles to them", async () => {
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-roles-"));
    try {
      writeFileSync(join(dir, "planner.json"), JSON.stringify({ default: [PLAN] }));
      writeFileSync(join(dir, "solver.json"), JSON.stringify({ default: [SOLVE] }));
      writeFileSync(
        join(dir, "config.json"),
        JSON.stringify({ engine: { pools: { pool_a: { script: "planner.json", model: "planner-policy" }, pool_b: { script: "solver.json" } } }, agent: { roles: { planner: "pool_a", solver: "pool_b", judge: "default" } } }),
      );
      const rt = await buildRuntime({ config: join(dir, "config.json") });
      try {
        expect(rt.describe.filter((l) => /^(pool|roles)/.test(l))).toEqual([
          `pool pool_a: simulated, in-process (script ${join(dir, "planner.json")}) — roles planner`,
          `pool pool_b: simulated, in-process (script ${join(dir, "solver.json")}) — roles solver`,
          "roles      planner → pool_a, solver → pool_b, judge → default",
        ]);
        const gw = rt.agentGateway!;
        expect(gw.roles).toEqual(["planner", "solver", "judge"]);
        await create(gw, "c1_0_0", undefined, Date.now());
        const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createAgentGatewayApp({ gateway: gw }).fetch });
        servers.push(server);
        const sdk = (role: string) => new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1/sessions/c1_0_0/openai/v1`, apiKey: TOKEN, maxRetries: 0, defaultHeaders: { "X-Agent-Role": role } });
        const texts: string[] = [];
        for (const role of ["planner", "solver", "judge"]) {
          const r = await sdk(role).chat.completions.create({ model: "qwen3", messages: [...PROMPT, { role: "user", content: `as ${role}` }] as OpenAI.ChatCompletionMessageParam[] });
          texts.push(r.choices[0]!.message.content ?? `tool_calls:${toolName(r)}`);
        }
        expect(texts).toEqual([PLAN, SOLVE, "tool_calls:calc"]);
        expect((await recordsOf(gw, "c1_0_0")).map((r) => [r.agent_role, r.served_model])).toEqual([["planner", "planner-policy"], ["solver", "pool_b"], ["judge", "qwen3"]]);
        // Per-role delivery over HTTP: GET /v1/groups?agent_role= on serve's API and store.
        await fillQueue(rt.service.store);
        const api = createRolloutsApp({ service: rt.service });
        const body = (await (await api.request("/v1/groups?consumer=s0&agent_role=solver")).json()) as { groups: { uid: string; failed: number; records: TrajectoryRecord[] }[] };
        expect(body.groups.map((g) => [g.uid, g.failed, g.records.map((r) => [r.key, r.agent_role, r.served_model])])).toEqual([["g1", 0, [["g1_0_1", "solver", "pool_b"], ["g1_1_0", "solver", "pool_b"]]]]);
        const bad = await api.request("/v1/groups?agent_role=a%20b");
        expect([bad.status, ((await bad.json()) as { error: { field: string } }).error.field]).toEqual([400, "agent_role"]);
      } finally {
        await rt.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
