import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createSessionsApp } from "../../functions/sessions.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { SessionHost, type SessionResult } from "../../shared/session/session-host.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { deleteByPrefix, randomPrefix, requireRedis, REDIS_URL } from "../helpers/redis.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import { depsFor, inputFor, POLICY, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";

const SECRET = "s3cret";
const redis = await requireRedis();
const prefix = randomPrefix("sessions-async");

/** A tool that answers every call 202 Accepted and remembers the call ids it got. */
let asyncTool: ReturnType<typeof Bun.serve>;
const received: string[] = [];
let commander: IoRedisCommander | undefined;

beforeAll(() => {
  asyncTool = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      received.push(((await req.json()) as { call_id: string }).call_id);
      return new Response(null, { status: 202 });
    },
  });
});
afterAll(async () => {
  await asyncTool.stop(true);
  await commander?.close();
  if (redis) await deleteByPrefix(prefix);
});

function toolsJson(timeoutMs: number): string {
  const tool = (name: string, param: string) => ({
    name,
    url: "http://127.0.0.1:{port}/tools/" + name,
    timeout_ms: timeoutMs,
    max_retries: 0,
    schema: { type: "function", function: { name, description: name, parameters: { type: "object", properties: { [param]: { type: "string" } }, required: [param] } } },
  });
  return JSON.stringify({ tools: [tool("calc", "expression"), tool("lookup", "query")] });
}

async function setup(storage: SessionStorage, timeoutMs: number) {
  const { deps, tok } = await depsFor(`http://127.0.0.1:${asyncTool.port}`, { secret: SECRET, toolsJson: toolsJson(timeoutMs) });
  const host = new SessionHost({ storage, createLoop: sessionLoopFactory(deps) });
  const app = createSessionsApp({ backend: host, secret: SECRET });
  const post = async (key: string, body: unknown, sign: string | null = SECRET) => {
    const raw = JSON.stringify(body);
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (sign) headers["x-edgeloop-signature"] = await signatureHeader(sign, raw, Date.now() / 1000);
    const res = await app.request(`/v1/sessions/${key}/tool-results`, { method: "POST", headers, body: raw });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  return { host, app, post, tok };
}

async function until(cond: () => boolean | Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await Bun.sleep(5);
  }
}

const storages: [string, () => SessionStorage][] = [["memory", () => new MemorySessionStorage()]];
if (redis) storages.push(["redis", () => new RedisSessionStorage((commander ??= new IoRedisCommander(REDIS_URL)), { prefix })]);

describe.each(storages)("async tool results (%s storage)", (_name, makeStorage) => {
  test("202 → the session waits (no live instance, a timer); a signed callback resumes it; bad signature 401, unknown 409, duplicate 409", async () => {
    const { host, post, tok } = await setup(makeStorage(), 60_000);
    const input = inputFor(0, 0, undefined, `cb${_name}`);
    const done = host.run(input);
    const callId = `${input.key}:1:0`;
    await until(async () => (await host.status(input.key))?.phase === "waiting");
    expect(received).toContain(callId);
    expect(host.pending).toBe(1);
    expect(host.timed).toBe(1);
    const st = (await host.status(input.key))!;
    expect(st.loop_state).toBe("awaiting_tools");
    expect(st.awaited.map((a) => a.call_id)).toEqual([callId]);

    expect(await post(input.key, { call_id: callId, content: "31" }, "wrong-secret")).toEqual({
      status: 401,
      body: { error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } },
    });
    expect((await post(input.key, { call_id: callId, content: "31" }, null)).status).toBe(401);
    expect(await post(input.key, { call_id: `${input.key}:1:7`, content: "31" })).toEqual({
      status: 409,
      body: { error: { code: "conflict", message: `session '${input.key}' has no tool call '${input.key}:1:7'`, field: "call_id" } },
    });
    expect(await post(input.key, { call_id: callId })).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "content: Invalid input: expected string, received undefined", field: "content" } },
    });
    expect(await post("nobody_0_0", { call_id: "nobody_0_0:1:0", content: "x" })).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "no session 'nobody_0_0'", field: "key" } },
    });
    expect(await post(input.key, { call_id: callId, content: "31", reward: 0.5 })).toEqual({ status: 200, body: { ok: true, key: input.key, call_id: callId } });
    expect((await post(input.key, { call_id: callId, content: "31" })).status).toBe(409);

    const r = (await done) as Extract<SessionResult, { status: "finished" }>;
    expect(r.status).toBe("finished");
    const out = r.outputs[0]!;
    expect(out.extra_fields.tool_calls).toBe(1);
    expect(out.extra_fields.tool_errors).toBe(0);
    expect(out.extra_fields.tool_rewards).toEqual([0.5]);
    expect(tok.decode(out.response_ids)).toContain("<tool_response>\n31\n</tool_response>");
    expect(host.pending).toBe(0);
    expect(host.timed).toBe(0);
  });

  test("a callback may report a failure (ok: false → an error observation counted in tool_errors) and metrics (extra_fields.tool_metrics)", async () => {
    const { host, post, tok } = await setup(makeStorage(), 60_000);
    const input = inputFor(0, 0, undefined, `fail${_name}`);
    const done = host.run(input);
    const callId = `${input.key}:1:0`;
    await until(async () => (await host.status(input.key))?.phase === "waiting");
    expect(await post(input.key, { call_id: callId, content: "Error executing tool 'calc': sandbox crashed", ok: false, metrics: { sandbox_ms: 1200, exit: 137 } })).toEqual({
      status: 200,
      body: { ok: true, key: input.key, call_id: callId },
    });
    const r = (await done) as Extract<SessionResult, { status: "finished" }>;
    const out = r.outputs[0]!;
    expect([out.extra_fields.tool_calls, out.extra_fields.tool_errors, out.extra_fields.tool_rewards]).toEqual([1, 1, []]);
    expect(out.extra_fields.tool_metrics).toEqual([{ turn: 1, name: "calc", metrics: { sandbox_ms: 1200, exit: 137 } }]);
    expect(tok.decode(out.response_ids)).toContain("<tool_response>\nError executing tool 'calc': sandbox crashed\n</tool_response>");
    expect(await post(input.key, { call_id: callId, content: "x", ok: "no" })).toEqual({
      status: 400,
      body: { error: { code: "invalid_input", message: "ok: Invalid input: expected boolean, received string", field: "ok" } },
    });
  });

  test("a missing result becomes an error observation at the tool's timeout_ms; a late callback is 409", async () => {
    const { host, post, tok } = await setup(makeStorage(), 150);
    const input = inputFor(0, 1, undefined, `to${_name}`);
    const out = (await host.run(input)) as Extract<SessionResult, { status: "finished" }>;
    expect(out.status).toBe("finished");
    const o = out.outputs[0]!;
    expect(o.extra_fields.tool_errors).toBe(1);
    expect(tok.decode(o.response_ids)).toContain("<tool_response>\nError executing tool 'calc': no asynchronous result within 150 ms\n</tool_response>");
    expect((await post(input.key, { call_id: `${input.key}:1:0`, content: "31" })).status).toBe(409);
  });
});

/** A policy whose first turn calls `calc` twice at once (two awaited results), then answers. */
const TWO_CALLS = {
  ...POLICY,
  rules: [
    {
      when: "Add 2 and 3, and 4 and 5.",
      turns: [
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"expression": "4+5"}}\n</tool_call>',
        "The sums are 5 and 9.\n#### 5 9",
      ],
    },
  ],
};

function twoCallInput(uid: string): SessionInputArg {
  const base = inputFor(0, 0, rolloutConfig({ multi_turn: { max_parallel_calls: 2 } }), uid);
  const prompt = [{ role: "user", content: "Add 2 and 3, and 4 and 5." }];
  return { ...base, kwargs: { ...base.kwargs, prompt, raw_prompt: prompt } };
}

describe.each(storages)("queue-mode delivery: deliverOnly + wake (%s storage)", (_name, makeStorage) => {
  test("the API process commits results without running the session; the worker's host continues it on wake, also when a delivery wins the fence against the worker's commit", async () => {
    const shared = makeStorage();
    const { deps, tok } = await depsFor(`http://127.0.0.1:${asyncTool.port}`, { secret: SECRET, toolsJson: toolsJson(60_000) });
    deps.client = new SimEngineClient(new SimEngine({ tokenizer: tok, script: TWO_CALLS }));
    // The worker's storage can run a delivery just before the worker's next commit (the race).
    let beforeNextPut: (() => Promise<void>) | null = null;
    const workerStorage: SessionStorage = {
      get: (k) => shared.get(k),
      delete: (k) => shared.delete(k),
      append: async (k, step, cp, o) => {
        const f = beforeNextPut;
        beforeNextPut = null;
        if (f) await f();
        return shared.append(k, step, cp, o);
      },
    };
    const worker = new SessionHost({ storage: workerStorage, createLoop: sessionLoopFactory(deps) });
    // The API process: its loops have an engine that must never be called.
    let apiEngineCalls = 0;
    const apiDeps = { ...deps, client: { generate: async () => { apiEngineCalls++; throw new Error("serve must not generate"); } } as unknown as typeof deps.client };
    const api = new SessionHost({ storage: shared, createLoop: sessionLoopFactory(apiDeps) });
    const input = twoCallInput(`wake${_name}`);
    const key = input.key;
    const done = worker.run(input);
    await until(async () => (await worker.status(key))?.phase === "waiting");
    expect((await worker.status(key))!.awaited.map((a) => a.call_id)).toEqual([`${key}:1:0`, `${key}:1:1`]);
    expect(api.wake(key)).toBe(false);
    expect(worker.wake("nobody_0_0")).toBe(false);

    await api.deliverOnly(key, { call_id: `${key}:1:0`, content: "5" });
    expect(api.pending).toBe(0);
    expect((await api.status(key))!.phase).toBe("running");
    // The second result is committed by the API process right before the worker's first commit
    // after the wake: the worker's commit loses the fence and is read again, not given up.
    beforeNextPut = () => api.deliverOnly(key, { call_id: `${key}:1:1`, content: "9" });
    expect(worker.wake(key)).toBe(true);
    const r = (await done) as Extract<SessionResult, { status: "finished" }>;
    expect(r.status).toBe("finished");
    const o = r.outputs[0]!;
    expect(o.extra_fields.tool_calls).toBe(2);
    expect(o.extra_fields.tool_errors).toBe(0);
    const text = tok.decode(o.response_ids);
    expect(text).toContain("<tool_response>\n5\n</tool_response>");
    expect(text).toContain("<tool_response>\n9\n</tool_response>");
    expect(apiEngineCalls).toBe(0);
    expect(worker.pending).toBe(0);
    expect(worker.timed).toBe(0);
    await expect(api.deliverOnly(key, { call_id: `${key}:1:1`, content: "9" })).rejects.toThrow("is not waiting for tool results");
    await expect(api.deliverOnly("nobody_0_0", { call_id: "nobody_0_0:1:0", content: "9" })).rejects.toThrow("no session 'nobody_0_0'");
  });
});

test("without tools.secret every callback is refused with 403 (call ids are predictable)", async () => {
  let delivered = 0;
  const app = createSessionsApp({ backend: { deliver: async () => void delivered++ }, apiToken: "api-token" });
  const raw = JSON.stringify({ call_id: "k_0_0:1:0", content: "x" });
  for (const headers of [{} as Record<string, string>, { "x-edgeloop-signature": await signatureHeader("anything", raw, Date.now() / 1000) }, { authorization: "Bearer api-token" }]) {
    const res = await app.request("/v1/sessions/k_0_0/tool-results", { method: "POST", headers, body: raw });
    expect(res.status).toBe(403);
    expect(await res.json()).toEqual({
      error: {
        code: "forbidden",
        message: "callbacks need tools.secret: asynchronous tool results must be signed (x-edgeloop-signature); set tools.secret (--tools-secret) on serve, the workers and the tool servers",
      },
    });
  }
  expect(delivered).toBe(0);
});
