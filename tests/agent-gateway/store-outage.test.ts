import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E7 for the agent gateway: while Redis (the agent sessions' store) is down, the openai_agent loop waiting for its
// agent is held, never failed; the agent's calls get 503s (its client retries) and go through once Redis is back.
const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
let redis: PrivateRedis;
beforeAll(async () => {
  tok = await defaultTokenizer();
  redis = await privateRedis({ persist: true });
});
afterAll(async () => {
  await redis?.dispose();
});

describe("openai_agent through a store outage", () => {
  test("the loop waits the outage out; the agent's call during it is a 503 its SDK retries; the record is complete", async () => {
    const c = new IoRedisCommander(redis.url, { reconnectMaxDelayMs: 200, onError: () => {} });
    try {
      const gw = new AgentGateway({ storage: new RedisSessionStorage(c, { prefix: "outage:" }), tokenizer: tok, client: new SimEngineClient(new SimEngine({ tokenizer: tok, script })), maxModelLen: 4096, pollMs: 50 });
      const app = createAgentGatewayApp({ gateway: gw });
      const appFetch = async (u: string | URL | Request, i?: RequestInit) => app.fetch(new Request(u as string, i));
      const statuses: number[] = [];
      let agentRun: Promise<void> = Promise.resolve();
      let restarted: Promise<void> = Promise.resolve();
      const link: AgentGatewayLink = {
        gateway: gw,
        publicUrl: () => "http://edgeloop.local",
        agent: { url: "http://agent.local/tasks", timeout_ms: 60_000, secret: null },
        fetch: (async (_u: string | URL | Request, init?: RequestInit) => {
          const task = AgentTask.parse(JSON.parse(String(init!.body)));
          const counting = async (u: string | URL | Request, i?: RequestInit) => {
            const r = await appFetch(u, i);
            statuses.push(r.status);
            return r;
          };
          const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, fetch: counting, maxRetries: 8 });
          agentRun = (async () => {
            // Redis goes down after the task was accepted; the agent's first call meets the outage.
            await new Promise((r) => setTimeout(r, 100));
            await redis.stop();
            restarted = Bun.sleep(1_500).then(() => redis.start());
            const messages = [...task.messages] as OpenAI.ChatCompletionMessageParam[];
            const r1 = await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
            const m = r1.choices[0]!.message;
            messages.push(m, { role: "tool", tool_call_id: m.tool_calls![0]!.id, content: "31" });
            await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
            await counting(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}` }, body: "{}" });
          })();
          return new Response(null, { status: 202 });
        }) as typeof fetch,
      };
      const loop = new OpenAIAgentLoop(ctxOf(tok, new SimEngineClient(new SimEngine({ tokenizer: tok, script })), config(), { reward: {}, agentGateway: link }));
      const outs = await loop.run(SP, { uid: "o0", session_id: 0, prompt: row0.prompt, reward_model: { style: "rule", ground_truth: "31" } });
      await agentRun;
      await restarted;
      expect(statuses.filter((s) => s === 503).length).toBeGreaterThan(0);
      expect(statuses.at(-1)).toBe(200);
      expect(outs.length).toBe(1);
      expect(outs[0]!.num_turns).toBe(4);
      expect(outs[0]!.reward_score).toBe(1);
      expect(outs[0]!.extra_fields.error).toBeUndefined();
    } finally {
      await c.close();
    }
  }, HANG_MS);
});
