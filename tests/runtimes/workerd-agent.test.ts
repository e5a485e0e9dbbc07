import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Miniflare } from "miniflare";
import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import { calcToolContent } from "../../infra/tools/calc.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { requireRedis } from "../helpers/redis.ts";
import { awaitRecords, comparableRecord, freePort, ROOT, startServices, startWorkerd, workerBindings, type Services, type Workerd } from "./harness.ts";
import { bunReference } from "./reference.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The agent gateway on the Durable Object path: rows with agent_name "openai_agent" run in their
// trajectory's object (the loop inside the alarm); the object also serves the agent's OpenAI
// endpoint and finish. The agent is an openai-SDK program in this process behind a task webhook;
// workerd (bundled by wrangler, run by Miniflare) listens on a loopback port the agent calls.
const redis = await requireRedis();
const SECRET = "agent-secret";
const row0 = JSON.parse(readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0]!);

/** What the test agent saw and did for one task. */
interface AgentRun {
  task: AgentTask;
  signed: boolean;
  model: string | null;
  replies: { finish_reason: string; content: string | null; tool_calls: unknown }[];
  finish: { status: number; body: unknown } | null;
  error: string | null;
}

/**
 * The test agent: a webhook that checks the task's signature, answers 202,
 * then runs an SDK agent against `task.base_url`: lists the models, one call
 * (a calc tool call expected), the tool's answer computed here as the example
 * tool server computes it, a second call (the answer), then `POST finish_url`.
 */
function startTestAgent() {
  const runs = new Map<string, AgentRun>();
  const pending: Promise<void>[] = [];
  const srv = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const raw = await req.text();
      const signed = await verifySignature(SECRET, req.headers.get(SIGNATURE_HEADER), raw, Date.now() / 1000);
      const task = AgentTask.parse(JSON.parse(raw));
      if (runs.has(task.key)) return new Response(null, { status: 202 });
      const run: AgentRun = { task, signed, model: null, replies: [], finish: null, error: null };
      runs.set(task.key, run);
      pending.push(runAgent(run).catch((e) => void (run.error = String(e))));
      return new Response(null, { status: 202 });
    },
  });
  return { url: `http://127.0.0.1:${srv.port}/tasks`, runs, settled: () => Promise.all(pending), stop: () => srv.stop(true) };
}

async function runAgent(run: AgentRun): Promise<void> {
  const { task } = run;
  const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, maxRetries: 0 });
  run.model = (await client.models.list()).data[0]?.id ?? null;
  const messages = [...task.messages] as ChatCompletionMessageParam[];
  const tools = task.tools as ChatCompletionTool[];
  const r1 = await client.chat.completions.create({ model: task.model, messages, tools });
  const m1 = r1.choices[0]!.message;
  run.replies.push({ finish_reason: r1.choices[0]!.finish_reason, content: m1.content, tool_calls: m1.tool_calls });
  messages.push(m1);
  for (const c of m1.tool_calls ?? []) {
    if (c.type !== "function") throw new Error(`unexpected tool call ${JSON.stringify(c)}`);
    messages.push({ role: "tool", tool_call_id: c.id, content: calcToolContent(JSON.parse(c.function.arguments)) });
  }
  const r2 = await client.chat.completions.create({ model: task.model, messages, tools });
  run.replies.push({ finish_reason: r2.choices[0]!.finish_reason, content: r2.choices[0]!.message.content, tool_calls: r2.choices[0]!.message.tool_calls });
  const res = await fetch(task.finish_url, {
    method: "POST",
    headers: { authorization: `Bearer ${task.api_key}`, "content-type": "application/json" },
    body: JSON.stringify({ metadata: { answer: r2.choices[0]!.message.content } }),
  });
  run.finish = { status: res.status, body: await res.json() };
}

let s: Services;
let w: Workerd;
let mf: Miniflare;
let agent: ReturnType<typeof startTestAgent>;
let port: number;

beforeAll(async () => {
  if (!redis) return;
  s = await startServices("workerd-agent");
  agent = startTestAgent();
  port = freePort();
  w = await startWorkerd(
    {
      ...workerBindings(s),
      EDGELOOP_AGENT_URL: agent.url,
      EDGELOOP_AGENT_SECRET: SECRET,
      EDGELOOP_AGENT_TIMEOUT_MS: "30000",
      EDGELOOP_PUBLIC_URL: `http://127.0.0.1:${port}/`,
    },
    undefined,
    { port },
  );
  mf = w.mf;
}, HANG_MS);

afterAll(async () => {
  await w?.stop();
  agent?.stop();
  await s?.stop();
});

describe.skipIf(!redis)("openai_agent in workerd: the agent gateway in the trajectory's Durable Object", () => {
  test("an SDK agent's two calls and finish, served by the object while its alarm runs the loop; records equal Bun's and tool_agent's tokens", async () => {
    const rows = [{ ...row0, uid: "wda0", agent_name: "openai_agent" }];
    const res = await mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    expect(((await res.json()) as { keys: string[] }).keys).toEqual(["wda0_0_0", "wda0_1_0"]);
    const records = await awaitRecords(s.prefix, ["wda0"], 2, 45_000);
    await agent.settled();

    // The tasks: signed, pointing at the Worker's own URL (EDGELOOP_PUBLIC_URL, trailing slash dropped).
    expect([...agent.runs.keys()].sort()).toEqual(["wda0_0_0", "wda0_1_0"]);
    for (const [key, run] of agent.runs) {
      expect(run.error).toBeNull();
      expect(run.signed).toBe(true);
      expect(run.task.base_url).toBe(`http://127.0.0.1:${port}/v1/sessions/${key}/openai/v1`);
      expect(run.task.finish_url).toBe(`http://127.0.0.1:${port}/v1/sessions/${key}/finish`);
      expect(run.model).toBe("qwen3");
      expect(run.replies.map((r) => r.finish_reason)).toEqual(["tool_calls", "stop"]);
      expect(run.replies[0]!.tool_calls).toEqual([{ id: `call_${sessionTag(key)}_0_0_0`, type: "function", function: { name: "calc", arguments: '{"expression":"12*3-5"}' } }]);
      expect(run.replies[1]!.content).toBe("The answer is 31.\n#### 31");
      expect(run.finish).toEqual({ status: 200, body: { ok: true, key, outputs: 1, finished_by: "agent" } });
    }
    for (const r of records.values()) {
      expect([r.error, r.agent_name, r.num_turns, r.reward_score, r.extra_fields.error ?? null]).toEqual([null, "openai_agent", 4, 1, null]);
    }
    // A closed session refuses further calls: 409 session_closed, through the Worker's port.
    const run0 = agent.runs.get("wda0_0_0")!;
    const late = await fetch(`${run0.task.base_url}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${run0.task.api_key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "qwen3", messages: [{ role: "user", content: "again?" }] }),
    });
    expect([late.status, ((await late.json()) as { error: { code: string } }).error.code]).toEqual([409, "session_closed"]);
    const wrong = await fetch(`${run0.task.base_url}/models`, { headers: { authorization: "Bearer nope" } });
    expect(wrong.status).toBe(401);
    const st = await mf.dispatchFetch("http://localhost/v1/sessions/wda0_0_0");
    expect(await st.json()).toMatchObject({ phase: "done" });

    // The Bun path (rollout --agent URL: openai_agent in-process, the gateway on a loopback port) writes the same records.
    agent.runs.clear();
    const bun = await bunReference(s, rows, { url: agent.url, secret: SECRET });
    await agent.settled();
    expect([...bun.keys()].sort()).toEqual(["wda0_0_0", "wda0_1_0"]);
    for (const [key, r] of records) expect(comparableRecord(r)).toEqual(comparableRecord(bun.get(key)!));

    // And the tokens are tool_agent's for the same row (its tool server answers calc with the same text).
    const ref = await bunReference(s, [{ ...row0, uid: "wda0", agent_name: "tool_agent" }]);
    for (const [key, r] of records) {
      const t = ref.get(key)!;
      expect([r.prompt_ids, r.response_ids, r.response_mask, r.rollout_log_probs, r.reward_score, r.num_turns]).toEqual([t.prompt_ids, t.response_ids, t.response_mask, t.rollout_log_probs, t.reward_score, t.num_turns]);
    }
  }, HANG_MS);
});
