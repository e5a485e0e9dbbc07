import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { AgentNoCallError, AgentTimeoutError, AgentWebhookError, OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";

// The agent's deadline: an agent that called the model and never finished yields records of the tokens so far
// flagged agent_timeout; one that never called fails its trajectory; a webhook that refuses fails it at once.
const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

function harness(agent: (task: AgentTask, client: OpenAI) => Promise<Response>, timeoutMs: number) {
  const engine = new SimEngine({ tokenizer: tok, script });
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096, pollMs: 20 });
  const app = createAgentGatewayApp({ gateway: gw });
  const appFetch = async (u: string | URL | Request, i?: RequestInit) => app.fetch(new Request(u as string, i));
  const tasks: AgentTask[] = [];
  const link: AgentGatewayLink = {
    gateway: gw,
    publicUrl: () => "http://edgeloop.local",
    agent: { url: "http://agent.local/tasks", timeout_ms: timeoutMs, secret: null },
    fetch: (async (_u: string | URL | Request, init?: RequestInit) => {
      const task = AgentTask.parse(JSON.parse(String(init!.body)));
      tasks.push(task);
      return agent(task, new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, fetch: appFetch, maxRetries: 0 }));
    }) as typeof fetch,
  };
  const loop = new OpenAIAgentLoop(ctxOf(tok, new SimEngineClient(engine), config(), { reward: {}, agentGateway: link }));
  return { gw, loop, tasks, engine, appFetch };
}

describe("openai_agent deadlines and webhook failures", () => {
  test("one call, no finish: the record holds that turn, error agent_timeout, reward scored by edgeloop", async () => {
    // The agent hangs after its first call; once the deadline closed the session, its next call is refused.
    let lateCall!: () => Promise<unknown>;
    const { loop, tasks, gw } = harness(async (task, client) => {
      await client.chat.completions.create({ model: task.model, messages: task.messages as OpenAI.ChatCompletionMessageParam[] });
      lateCall = () => client.chat.completions.create({ model: task.model, messages: task.messages as OpenAI.ChatCompletionMessageParam[], temperature: 0.5 }).then((r) => r, (e: unknown) => e);
      return new Response(null, { status: 202 });
    }, 1500);
    const outs = await loop.run(SP, { uid: "t0", session_id: 0, prompt: row0.prompt, data_source: "edgeloop/arith", reward_model: { style: "rule", ground_truth: "31" } });
    expect(tasks.length).toBe(1);
    expect(outs.length).toBe(1);
    const o = outs[0]!;
    expect(o.extra_fields.error).toBe("agent_timeout");
    expect(o.extra_fields.terminated_by).toBe("agent_timeout");
    expect(o.num_turns).toBe(2);
    expect(tok.decode(o.response_ids as number[])).toBe('<think>\nLet me compute 12*3-5.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*3-5"}}\n</tool_call><|im_end|>');
    expect(o.reward_score).toBe(0);
    expect((await gw.get("t0_0_0"))!.finish!.by).toBe("timeout");
    expect(((await lateCall()) as { status?: number }).status).toBe(409);
  });

  test("no call at all: the trajectory fails with AgentTimeoutError", async () => {
    const { loop } = harness(async () => new Response(null, { status: 202 }), 100);
    const err = await loop.run(SP, { uid: "t1", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentTimeoutError);
    expect(err.message).toBe("agent_timeout: the agent made no call and did not finish within agent.timeout_ms 100 ms");
  });

  test("a webhook answering 400 fails the trajectory at once, naming the webhook and its answer", async () => {
    const { loop, engine } = harness(async () => new Response("no such task type", { status: 400 }), 60_000);
    const err = await loop.run(SP, { uid: "t2", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentWebhookError);
    expect(err.message).toBe("agent webhook http://agent.local/tasks answered 400: no such task type");
    expect(engine.stats.requests).toBe(0);
  });

  test("a task answered 200 with a result finishes the session with the agent's reward and metadata", async () => {
    const { loop } = harness(async (task, client) => {
      await client.chat.completions.create({ model: task.model, messages: task.messages as OpenAI.ChatCompletionMessageParam[] });
      return Response.json({ reward: 0.25, metadata: { note: "sync agent" } });
    }, 60_000);
    const outs = await loop.run(SP, { uid: "t3", session_id: 0, prompt: row0.prompt, reward_model: { style: "rule", ground_truth: "31" } });
    expect(outs.length).toBe(1);
    expect(outs[0]!.reward_score).toBe(0.25);
    expect(outs[0]!.extra_fields.agent_metadata).toEqual({ note: "sync agent" });
    expect(outs[0]!.extra_fields.error).toBeUndefined();
  });
});

/** The agent of the example row: a tool call, then the answer, with the tool's result "31". */
async function twoCalls(task: AgentTask, client: OpenAI): Promise<void> {
  const messages = [...task.messages] as OpenAI.ChatCompletionMessageParam[];
  const r1 = await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
  const m = r1.choices[0]!.message;
  messages.push(m, { role: "tool", tool_call_id: m.tool_calls![0]!.id, content: "31" });
  await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
}

describe("what the agent and its webhook answer", () => {
  test("200 with an acknowledgement body ({accepted: true}) accepts the task like 202; the agent then works and finishes", async () => {
    let run: Promise<unknown> = Promise.resolve();
    const { loop, gw } = harness(async (task, client) => {
      run = twoCalls(task, client).then(() => gw.finish(task.key, { by: "agent", reward: 1 }));
      return Response.json({ accepted: true, key: task.key });
    }, 60_000);
    const outs = await loop.run(SP, { uid: "w0", session_id: 0, prompt: row0.prompt });
    await run;
    expect(outs.length).toBe(1);
    expect(outs[0]!.reward_score).toBe(1);
    expect(outs[0]!.num_turns).toBe(4);
  });

  test("an agent that finishes without calling the model fails its trajectory, with its own error text", async () => {
    const { loop, gw } = harness(async (task) => {
      queueMicrotask(() => void gw.finish(task.key, { by: "agent", metadata: { error: "Connection error." } }));
      return new Response(null, { status: 202 });
    }, 60_000);
    const err = await loop.run(SP, { uid: "w1", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentNoCallError);
    expect(err.message).toBe("agent_no_call: the agent finished (by its finish call) without calling the model; its metadata.error: Connection error.");
  });

  for (const [what, answer] of [
    ["500", () => new Response("oops", { status: 500 })],
    ["200 with a body that is not JSON", () => new Response("done", { status: 200 })],
  ] as const) {
    test(`an agent that worked inside the request and then answered ${what}: its work counts, the task is not sent again`, async () => {
      const { loop, tasks } = harness(async (task, client) => {
        await twoCalls(task, client);
        return answer();
      }, 1_500);
      const outs = await loop.run(SP, { uid: "w2", session_id: 0, prompt: row0.prompt, reward_model: { style: "rule", ground_truth: "31" } });
      expect(tasks.length).toBe(1);
      expect(outs.length).toBe(1);
      expect(outs[0]!.num_turns).toBe(4);
      // It never called finish: its deadline closes the session with every token kept.
      expect(outs[0]!.extra_fields.error).toBe("agent_timeout");
      expect(outs[0]!.reward_score).toBe(1);
    });
  }

  test("a webhook failing every attempt fails the trajectory and closes the session: later calls and finish get 409", async () => {
    let seen: AgentTask | null = null;
    const { loop, tasks, engine, appFetch } = harness(async (task) => {
      seen = task;
      return new Response("oops", { status: 500 });
    }, 60_000);
    const err = await loop.run(SP, { uid: "w3", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentWebhookError);
    expect(err.message).toBe("agent webhook http://agent.local/tasks answered 500: oops (3 attempts)");
    expect(tasks.length).toBe(3);
    const task = seen!;
    const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, fetch: appFetch, maxRetries: 2 });
    const late = await client.chat.completions.create({ model: task.model, messages: task.messages as OpenAI.ChatCompletionMessageParam[] }).catch((e) => e);
    expect(late.status).toBe(409);
    expect(late.error).toMatchObject({ code: "session_closed" });
    expect(engine.stats.requests).toBe(0);
    const fin = await appFetch(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}` }, body: JSON.stringify({ reward: 1 }) });
    expect(fin.status).toBe(409);
    expect(((await fin.json()) as { error: { message: string } }).error.message).toBe(
      "agent session 'w3_0_0' is closed (its trajectory failed); no more calls are answered",
    );
  });
});

