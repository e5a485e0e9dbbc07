import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Hono } from "hono";
import { join } from "node:path";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { signatureHeader, SIGNATURE_HEADER } from "../../shared/tools/signature.ts";
import { runCalculatorAgent, type CalculatorAgentResult } from "../../infra/agent-example/agent.ts";
import { startAgentServer, type AgentServer } from "../../infra/agent-example/server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import examples from "../../infra/tools/tools.example.json";

// A small OpenAI-compatible endpoint shaped like the agent gateway's (`/v1/sessions/{key}/openai/v1`
// and `/v1/sessions/{key}/finish`): each session answers from a script and records every request.
type Script = (n: number, body: Record<string, unknown>, signal: AbortSignal) => Response | Promise<Response>;
interface FakeSession {
  script: Script;
  requests: { auth: string | undefined; body: Record<string, unknown> }[];
  finishes: { auth: string | undefined; body: unknown }[];
  finished: Promise<void>;
  markFinished: () => void;
}

const sessions = new Map<string, FakeSession>();
const fake = new Hono();
fake.post("/v1/sessions/:key/openai/v1/chat/completions", async (c) => {
  const s = sessions.get(c.req.param("key"));
  if (!s) return c.json({ error: { message: "no such session" } }, 404);
  const body = (await c.req.json()) as Record<string, unknown>;
  s.requests.push({ auth: c.req.header("authorization"), body });
  return s.script(s.requests.length, body, c.req.raw.signal);
});
fake.post("/v1/sessions/:key/finish", async (c) => {
  const s = sessions.get(c.req.param("key"))!;
  s.finishes.push({ auth: c.req.header("authorization"), body: await c.req.json() });
  s.markFinished();
  return c.json({ ok: true });
});

let fakeServer: ReturnType<typeof Bun.serve>;
let fakeUrl: string;
let tools: ToolServer;
beforeAll(() => {
  fakeServer = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: fake.fetch });
  fakeUrl = `http://127.0.0.1:${fakeServer.port}`;
  tools = startToolServer({});
});
afterAll(async () => {
  await fakeServer.stop(true);
  await tools.stop();
});

let nextId = 0;
/** A new session on the fake endpoint and the task edgeloop would send for it. */
function session(script: Script): { task: AgentTask; s: FakeSession } {
  const key = `u${process.pid}x${++nextId}_0_0`;
  let markFinished!: () => void;
  const finished = new Promise<void>((r) => (markFinished = r));
  const s: FakeSession = { script, requests: [], finishes: [], finished, markFinished };
  sessions.set(key, s);
  const task = AgentTask.parse({
    key,
    uid: key.split("_")[0],
    session_id: 0,
    base_url: `${fakeUrl}/v1/sessions/${key}/openai/v1`,
    api_key: `sk-session-${key}`,
    finish_url: `${fakeUrl}/v1/sessions/${key}/finish`,
    model: "qwen3",
    messages: [
      { role: "system", content: "You are a careful calculator. Use the calc tool." },
      { role: "user", content: "What is (3+4)*5?" },
    ],
    tools: examples.tools.map((t) => t.schema),
    deadline: Date.now() + 60_000,
    row: { data_source: "arith", reward_model: { ground_truth: "35" }, extra_info: null },
  });
  return { task, s };
}

function completion(message: Record<string, unknown>, id = "chatcmpl-1"): Response {
  return Response.json({
    id,
    object: "chat.completion",
    created: 1_700_000_000,
    model: "qwen3",
    choices: [{ index: 0, message, logprobs: null, finish_reason: message.tool_calls ? "tool_calls" : "stop" }],
    usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
  });
}

// The first reply carries fields the SDK does not type (reasoning_content) and nulls it does: all must come back unchanged.
const CALL_REPLY = {
  role: "assistant",
  content: "Let me compute that.",
  reasoning_content: "(3+4) is 7, times 5.",
  refusal: null,
  tool_calls: [{ id: "call_7f3a", type: "function", function: { name: "calc", arguments: '{"expression":"(3+4)*5"}' } }],
};
const FINAL_REPLY = { role: "assistant", content: "(3+4)*5 = 35", refusal: null };
const calcThenAnswer: Script = (n) => completion(n === 1 ? CALL_REPLY : FINAL_REPLY, `chatcmpl-${n}`);

async function toolServerContent(expression: string): Promise<string> {
  const res = await fetch(`${tools.url}/tools/calc`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ call_id: `t:${++nextId}:0`, name: "calc", arguments: { expression }, key: "t_0_0", turn: 1 }),
  });
  return ((await res.json()) as { content: string }).content;
}

describe("runCalculatorAgent against an OpenAI-compatible fake", () => {
  test("a calc call then an answer: exact second request, finish body and bearer", async () => {
    const { task, s } = session(calcThenAnswer);
    const r = await runCalculatorAgent(task);
    expect(r).toEqual({ steps: 2, answer: "(3+4)*5 = 35" });
    expect(s.requests.map((q) => q.auth)).toEqual([`Bearer ${task.api_key}`, `Bearer ${task.api_key}`]);
    const prompt = [
      { role: "system", content: "You are a careful calculator. Use the calc tool." },
      { role: "user", content: "What is (3+4)*5?" },
    ];
    expect(s.requests[0]!.body).toEqual({ model: "qwen3", messages: prompt, tools: examples.tools.map((t) => t.schema) });
    expect(s.requests[1]!.body.messages).toEqual([...prompt, CALL_REPLY, { role: "tool", tool_call_id: "call_7f3a", name: "calc", content: "35" }]);
    // The same text the example tool server answers for the same expression.
    expect(await toolServerContent("(3+4)*5")).toBe("35");
    expect(s.finishes).toEqual([{ auth: `Bearer ${task.api_key}`, body: { metadata: { steps: 2, answer: "(3+4)*5 = 35" } } }]);
  });

  test("several calls in one reply: unknown tool, bad arguments and a refused expression answer in call order", async () => {
    const calls = [
      { id: "c1", type: "function", function: { name: "weather", arguments: '{"city":"Paris"}' } },
      { id: "c2", type: "function", function: { name: "calc", arguments: "{expression: 1}" } },
      { id: "c3", type: "function", function: { name: "calc", arguments: '{"expression":"x = 3"}' } },
      { id: "c4", type: "function", function: { name: "calc", arguments: '{"expression":"0.1 + 0.2"}' } },
    ];
    const { task, s } = session((n) => completion(n === 1 ? { role: "assistant", content: null, tool_calls: calls } : FINAL_REPLY));
    expect(await runCalculatorAgent(task)).toEqual({ steps: 2, answer: "(3+4)*5 = 35" });
    const sent = (s.requests[1]!.body.messages as unknown[]).slice(2);
    expect(sent).toEqual([
      { role: "assistant", content: null, tool_calls: calls },
      { role: "tool", tool_call_id: "c1", name: "weather", content: "Error: unknown tool 'weather'" },
      { role: "tool", tool_call_id: "c2", name: "calc", content: "Error: arguments are not a JSON object (JSON Parse error: Expected '}')" },
      { role: "tool", tool_call_id: "c3", name: "calc", content: "Error: assignments are not allowed" },
      { role: "tool", tool_call_id: "c4", name: "calc", content: "0.3" },
    ]);
    expect(await toolServerContent("x = 3")).toBe("Error: assignments are not allowed");
  });

  test("maxSteps: a model that always calls a tool is stopped after maxSteps calls", async () => {
    const { task, s } = session((n) => completion({ ...CALL_REPLY, content: `step ${n}` }));
    expect(await runCalculatorAgent(task, { maxSteps: 3 })).toEqual({ steps: 3, answer: "step 3" });
    expect(s.requests.length).toBe(3);
    expect((s.requests[2]!.body.messages as unknown[]).length).toBe(2 + 2 * 2);
    expect(s.finishes.map((f) => f.body)).toEqual([{ metadata: { steps: 3, answer: "step 3" } }]);
  });

  test("an endpoint that keeps failing: the SDK's 2 retries, then a finish with metadata.error", async () => {
    const { task, s } = session(() => Response.json({ error: { message: "engine unavailable", type: "server_error" } }, { status: 503, headers: { "retry-after-ms": "5" } }));
    const r = await runCalculatorAgent(task);
    expect(r).toEqual({ steps: 0, answer: null, error: "503 engine unavailable" });
    expect(s.requests.length).toBe(3);
    expect(s.finishes).toEqual([{ auth: `Bearer ${task.api_key}`, body: { metadata: { steps: 0, answer: null, error: "503 engine unavailable" } } }]);
  });

  test("a failing call after a good step keeps the steps and answer so far", async () => {
    const { task, s } = session((n) => (n === 1 ? completion(CALL_REPLY) : Response.json({ error: { message: "context too long" } }, { status: 400 })));
    expect(await runCalculatorAgent(task)).toEqual({ steps: 1, answer: "Let me compute that.", error: "400 context too long" });
    expect(s.requests.length).toBe(2);
    expect(s.finishes[0]!.body).toEqual({ metadata: { steps: 1, answer: "Let me compute that.", error: "400 context too long" } });
  });

  test("a finish that keeps failing rejects naming the session", async () => {
    const { task } = session(calcThenAnswer);
    const broken = { ...task, finish_url: `${fakeUrl}/nowhere` };
    await expect(runCalculatorAgent(broken)).rejects.toThrow(`finish of session '${task.key}' failed: HTTP 404 404 Not Found`);
  });
});

describe("agent webhook server", () => {
  const SECRET = "agent-secret";
  let open: AgentServer;
  let signed: AgentServer;
  const done = new Map<string, CalculatorAgentResult>();
  beforeAll(() => {
    const onDone = (key: string, o: { result: CalculatorAgentResult } | { error: unknown }) => {
      if ("result" in o) done.set(key, o.result);
    };
    open = startAgentServer({ onDone });
    signed = startAgentServer({ secret: SECRET, onDone });
  });
  afterAll(async () => {
    await open.stop();
    await signed.stop();
  });

  async function post(server: AgentServer, body: unknown, sig?: string | null) {
    const raw = typeof body === "string" ? body : JSON.stringify(body);
    const headers: Record<string, string> = { "content-type": "application/json" };
    const h = sig === undefined ? await signatureHeader(SECRET, raw, Date.now() / 1000) : sig;
    if (h) headers[SIGNATURE_HEADER] = h;
    const res = await fetch(`${server.url}/tasks`, { method: "POST", headers, body: raw });
    return { status: res.status, body: await res.json() };
  }

  test("GET /health", async () => {
    const res = await fetch(`${open.url}/health`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true, running: 0 });
  });

  test("202 at once, the agent runs in the background; a repeated task (running or finished) is not run again", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const { task, s } = session(async (n) => {
      if (n === 1) await gate;
      return calcThenAnswer(n, {}, new AbortController().signal);
    });
    expect(await post(open, task, null)).toEqual({ status: 202, body: { accepted: true, key: task.key } });
    expect(await post(open, task, null)).toEqual({ status: 202, body: { accepted: true, key: task.key, duplicate: true } });
    expect(open.running).toBe(1);
    release();
    await s.finished;
    while (open.running > 0) await Bun.sleep(5);
    expect(done.get(task.key)).toEqual({ steps: 2, answer: "(3+4)*5 = 35" });
    expect(await post(open, task, null)).toEqual({ status: 202, body: { accepted: true, key: task.key, duplicate: true } });
    await Bun.sleep(50);
    expect(s.requests.length).toBe(2);
    expect(s.finishes.map((f) => f.body)).toEqual([{ metadata: { steps: 2, answer: "(3+4)*5 = 35" } }]);
  });

  test("signatures: a good one is accepted; bad, missing or stale ones are 401 and nothing runs", async () => {
    const { task, s } = session(calcThenAnswer);
    const unauthorized = { status: 401, body: { error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } } };
    expect(await post(signed, task, "t=1,v1=abc")).toEqual(unauthorized);
    expect(await post(signed, task, null)).toEqual(unauthorized);
    expect(await post(signed, task, await signatureHeader(SECRET, JSON.stringify(task), Date.now() / 1000 - 301))).toEqual(unauthorized);
    expect(await post(signed, task, await signatureHeader("other-secret", JSON.stringify(task), Date.now() / 1000))).toEqual(unauthorized);
    expect(s.requests.length).toBe(0);
    expect(await post(signed, task)).toEqual({ status: 202, body: { accepted: true, key: task.key } });
    await s.finished;
    expect(s.finishes.map((f) => f.body)).toEqual([{ metadata: { steps: 2, answer: "(3+4)*5 = 35" } }]);
  });

  test("a bad task is 400 naming the field; nothing runs", async () => {
    const { task, s } = session(calcThenAnswer);
    const { base_url: _, ...noBase } = task;
    expect(await post(open, noBase, null)).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "body.base_url: Invalid input: expected string, received undefined", field: "body.base_url" } },
    });
    expect(await post(open, { ...task, messages: [] }, null)).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "body.messages: Too small: expected array to have >=1 items", field: "body.messages" } },
    });
    expect(await post(open, { ...task, finish_url: "not a url" }, null)).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "body.finish_url: Invalid URL", field: "body.finish_url" } },
    });
    expect(await post(open, "{not json", null)).toEqual({ status: 400, body: { error: { code: "invalid_input", message: "body: not valid JSON", field: "body" } } });
    await Bun.sleep(50);
    expect(s.requests.length).toBe(0);
  });

  test("stop() aborts a run in progress, which still finishes its session with metadata.error", async () => {
    const srv = startAgentServer({});
    let seen!: () => void;
    const reached = new Promise<void>((r) => (seen = r));
    const { task, s } = session((_n, _b, signal) => {
      seen();
      return new Promise<Response>((resolve) => signal.addEventListener("abort", () => resolve(new Response(null, { status: 499 }))));
    });
    expect((await post(srv, task, null)).status).toBe(202);
    await reached;
    await srv.stop();
    expect(s.finishes).toEqual([{ auth: `Bearer ${task.api_key}`, body: { metadata: { steps: 0, answer: null, error: "aborted: the agent server is stopping" } } }]);
    expect(s.requests.length).toBe(1);
  });
});

describe("edgeloop agent-example", () => {
  const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");

  test("prints its webhook URL and serves it until SIGTERM", async () => {
    const p = Bun.spawn([process.execPath, MAIN, "agent-example", "--port", "0", "--secret", "s3"], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
    try {
      const reader = p.stdout.getReader();
      let out = "";
      while (!out.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) break;
        out += new TextDecoder().decode(value);
      }
      const m = /^edgeloop example agent on (http:\/\/127\.0\.0\.1:(\d+))\/tasks\n$/.exec(out);
      expect(m).not.toBeNull();
      expect((await fetch(`${m![1]}/health`)).status).toBe(200);
      const bad = await fetch(`${m![1]}/tasks`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      expect(bad.status).toBe(401);
    } finally {
      p.kill("SIGTERM");
    }
    expect(await p.exited).toBe(0);
  });

  test("a bad flag is one line and exit code 2", () => {
    const p = Bun.spawnSync([process.execPath, MAIN, "agent-example", "--max-steps", "0"], { stdout: "pipe", stderr: "pipe", env: { ...process.env, EDGELOOP_DEBUG: "" } });
    expect(p.exitCode).toBe(2);
    expect(p.stderr.toString()).toBe("edgeloop: --max-steps must be an integer 1..1000, got '0' (see edgeloop agent-example --help)\n");
  });
});
