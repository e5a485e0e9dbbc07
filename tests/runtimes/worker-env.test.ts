import { describe, expect, test } from "bun:test";
import { agentSettings, workerRuntime, workerStartWarnings, type Env } from "../../infra/cloudflare/env.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";

const env = (v: Partial<Env>) => v as Env;

describe("Worker env: the agent gateway's variables", () => {
  test("EDGELOOP_AGENT_* and EDGELOOP_PUBLIC_URL over the config's agent section", () => {
    const cfg = parseAppConfig({ agent: { url: "http://cfg/tasks", timeout_ms: 5000, secret: "s0", public_url: "http://cfg-public" } }, "t");
    expect(agentSettings(env({}), cfg)).toEqual({ agent: { url: "http://cfg/tasks", timeout_ms: 5000, secret: "s0", max_reply_bytes: 4194304, abandoned_mask: "zero" }, publicUrl: "http://cfg-public" });
    expect(agentSettings(env({ EDGELOOP_AGENT_URL: "https://a.example/t", EDGELOOP_AGENT_SECRET: "s1", EDGELOOP_AGENT_TIMEOUT_MS: "1200", EDGELOOP_PUBLIC_URL: "https://w.example/" }), cfg)).toEqual({
      agent: { url: "https://a.example/t", timeout_ms: 1200, secret: "s1", max_reply_bytes: 4194304, abandoned_mask: "zero" },
      publicUrl: "https://w.example",
    });
    expect(agentSettings(env({}), parseAppConfig({}, "t"))).toEqual({ agent: { url: null, timeout_ms: 600_000, secret: null, max_reply_bytes: 4194304, abandoned_mask: "zero" }, publicUrl: null });
  });

  test("a bad value is a ConfigError naming the variable", () => {
    const cfg = parseAppConfig({}, "t");
    expect(() => agentSettings(env({ EDGELOOP_AGENT_TIMEOUT_MS: "10s" }), cfg)).toThrow("config EDGELOOP_AGENT_TIMEOUT_MS: must be a positive integer (milliseconds), got '10s'");
    expect(() => agentSettings(env({ EDGELOOP_AGENT_TIMEOUT_MS: "3000000000" }), cfg)).toThrow("config EDGELOOP_AGENT_TIMEOUT_MS: must be <= 2147483647 (milliseconds; setTimeout's largest delay), got '3000000000'");
    expect(agentSettings(env({ EDGELOOP_AGENT_TIMEOUT_MS: "2147483647" }), cfg).agent.timeout_ms).toBe(2_147_483_647);
    expect(() => agentSettings(env({ EDGELOOP_PUBLIC_URL: "edgeloop.workers.dev" }), cfg)).toThrow("config EDGELOOP_PUBLIC_URL: must be an http(s) URL, got 'edgeloop.workers.dev'");
    expect(() => agentSettings(env({ EDGELOOP_AGENT_URL: "ftp://x/y" }), cfg)).toThrow("config EDGELOOP_AGENT_URL: must be an http(s) URL, got 'ftp://x/y'");
  });
});

describe("Worker env: EDGELOOP_CONFIG is honoured or refused (issue 18 item 10)", () => {
  const base = { UPSTASH_REDIS_REST_URL: "http://127.0.0.1:1", UPSTASH_REDIS_REST_TOKEN: "t", EDGELOOP_ENGINE_URL: "http://127.0.0.1:2" };

  test("engine.model reaches the engine, reward.url becomes the webhook reward, engine.url stands in for EDGELOOP_ENGINE_URL", async () => {
    const bodies: Record<string, unknown>[] = [];
    const engine = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      async fetch(req) {
        bodies.push((await req.json()) as Record<string, unknown>);
        return Response.json({ choices: [{ index: 0, text: "4", token_ids: [19], logprobs: { token_logprobs: [-0.5], tokens: ["4"] }, finish_reason: "stop" }] });
      },
    });
    try {
      const config = { engine: { url: `http://127.0.0.1:${engine.port}`, model: "Qwen/Qwen3-8B" }, reward: { url: "http://127.0.0.1:3/reward" } };
      const rt = await workerRuntime(env({ UPSTASH_REDIS_REST_URL: base.UPSTASH_REDIS_REST_URL, UPSTASH_REDIS_REST_TOKEN: "t", EDGELOOP_CONFIG: JSON.stringify(config), EDGELOOP_TOOLS_SECRET: "s" }));
      expect(rt.deps.reward).toEqual({ webhook: { url: "http://127.0.0.1:3/reward", timeout_ms: 30_000, max_retries: 2, max_reply_bytes: 4194304 }, secret: "s" });
      await rt.deps.client.generate({ request_id: "r1", routing_key: "k", prompt_ids: [1, 2, 3], max_tokens: 4, sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true } });
      expect(bodies.map((b) => [b.model, b.prompt])).toEqual([["Qwen/Qwen3-8B", [1, 2, 3]]]);
    } finally {
      engine.stop(true);
    }
  });

  const refused: [string, unknown, string][] = [
    ["max_staleness", { rollout: { max_staleness: 1 } }, "config rollout.max_staleness: the Worker keeps no policy versions (POST /v1/model-version, /v1/consumed-version are served by edgeloop serve): run admission-controlled batches there (in EDGELOOP_CONFIG)"],
    ["agent_loop_config_path", { rollout: { agent: { agent_loop_config_path: "loops.json" } } }, "config rollout.agent.agent_loop_config_path: the Worker has no file system: register custom loops with registerWorkerAgentLoop(name, loop) in your Worker entry (in EDGELOOP_CONFIG)"],
    ["oversample", { rollout: { oversample: 1.25 } }, "config rollout.oversample: over-sampling runs in edgeloop serve and its workers, not on the Worker (in EDGELOOP_CONFIG)"],
    ["engine.replicas", { engine: { replicas: 2 } }, "config engine.replicas: the Worker has no simulated engine: put replicas behind `edgeloop gateway` and point EDGELOOP_ENGINE_URL at it (in EDGELOOP_CONFIG)"],
    ["tools.file", { tools: { file: "tools.json" } }, "config tools.file: the Worker has no file system: put the tools file's JSON in EDGELOOP_TOOLS (in EDGELOOP_CONFIG)"],
    ["gateway", { gateway: { max_attempts: 5 } }, "config gateway: the Worker runs no engine gateway: run `edgeloop gateway` and point EDGELOOP_ENGINE_URL at it (in EDGELOOP_CONFIG)"],
    ["engine.pools", { engine: { pools: { pool_a: { url: "http://127.0.0.1:9" } } } }, "config engine.pools: the Worker's agent gateway calls one engine (EDGELOOP_ENGINE_URL): serve a policy per agent role with edgeloop serve (in EDGELOOP_CONFIG)"],
    ["agent.roles", { agent: { roles: { planner: "default" } } }, "config agent.roles: the Worker's agent gateway calls one engine (EDGELOOP_ENGINE_URL): serve a policy per agent role with edgeloop serve (in EDGELOOP_CONFIG)"],
    ["store.url", { store: { url: "redis://127.0.0.1:6379" } }, "config store.url: the Worker's store is Upstash (UPSTASH_REDIS_REST_URL/TOKEN); leave store.url out (in EDGELOOP_CONFIG)"],
  ];
  for (const [name, config, message] of refused) {
    test(`${name} is refused at start, naming the key`, async () => {
      await expect(workerRuntime(env({ ...base, EDGELOOP_CONFIG: JSON.stringify(config) }))).rejects.toThrow(message);
    });
  }

  test("EDGELOOP_ENGINE_FORMAT is checked (it was cast as is)", async () => {
    await expect(workerRuntime(env({ ...base, EDGELOOP_ENGINE_FORMAT: "tgi" }))).rejects.toThrow("config EDGELOOP_ENGINE_FORMAT: must be vllm, vllm-generate or sglang, got 'tgi'");
  });
});

describe("Worker entry: routes", () => {
  test("an unserved route is a JSON 404 naming the routes the entry serves", async () => {
    const worker = (await import("../../infra/cloudflare/worker.ts")).default;
    const res = await worker.fetch(new Request("http://w/v1/rollouts/abc"), env({ EDGELOOP_ALLOW_ANONYMOUS: "1" }), {} as never);
    expect(res.status).toBe(404);
    expect(res.headers.get("content-type")).toContain("application/json");
    expect(await res.json()).toEqual({
      error: {
        code: "not_found",
        message:
          "no route GET /v1/rollouts/abc on the Workers entry; it serves GET /health, POST /v1/rollouts, GET /v1/groups/{uid}, GET /v1/sessions/{key}, POST /v1/sessions/{key}/tool-results, POST /v1/sessions/{key}/openai/v1/chat/completions, GET /v1/sessions/{key}/openai/v1/models, POST /v1/sessions/{key}/anthropic/v1/messages, POST /v1/sessions/{key}/finish (batch progress, trajectories, groups to consume, /metrics and the viewer are served by edgeloop serve)",
      },
    });
  });
});

describe("Worker start warnings (S20): agent tasks unsigned, once per isolate", () => {
  const WARNING =
    "warning    agent tasks are sent unsigned (no EDGELOOP_AGENT_SECRET): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set EDGELOOP_AGENT_SECRET (a secret; the agent must verify x-edgeloop-signature with it)";
  test("which settings warn: an agent URL (variable or config) without a secret (variable or config)", () => {
    expect(workerStartWarnings(env({ EDGELOOP_AGENT_URL: "http://127.0.0.1:9/tasks" }))).toEqual([WARNING]);
    expect(workerStartWarnings(env({ EDGELOOP_CONFIG: JSON.stringify({ agent: { url: "http://127.0.0.1:9/tasks" } }) }))).toEqual([WARNING]);
    expect(workerStartWarnings(env({ EDGELOOP_AGENT_URL: "http://127.0.0.1:9/tasks", EDGELOOP_AGENT_SECRET: "s" }))).toEqual([]);
    expect(workerStartWarnings(env({ EDGELOOP_CONFIG: JSON.stringify({ agent: { url: "http://127.0.0.1:9/tasks", secret: "s" } }) }))).toEqual([]);
    expect(workerStartWarnings(env({}))).toEqual([]);
    // A configuration that does not parse warns of nothing here (the requests needing it fail naming it).
    expect(workerStartWarnings(env({ EDGELOOP_CONFIG: "{", EDGELOOP_AGENT_URL: "http://127.0.0.1:9/tasks" }))).toEqual([]);
  });

  test("the Worker's fetch prints the warning with console.warn on its first request only", async () => {
    const worker = (await import("../../infra/cloudflare/worker.ts")).default;
    const warned: string[] = [];
    const logged: string[] = [];
    const [warn, log] = [console.warn, console.log];
    console.warn = (...a: unknown[]) => void warned.push(a.map(String).join(" "));
    console.log = (...a: unknown[]) => void logged.push(a.map(String).join(" "));
    try {
      const e = env({ EDGELOOP_AGENT_URL: "http://127.0.0.1:9/tasks", EDGELOOP_API_TOKEN: "t" });
      const ctx = { waitUntil: () => undefined, passThroughOnException: () => undefined };
      for (let i = 0; i < 3; i++) expect((await worker.fetch(new Request("http://w/health"), e, ctx as never)).status).toBe(200);
    } finally {
      console.warn = warn;
      console.log = log;
    }
    expect(warned).toEqual([`edgeloop (workerd) ${WARNING}`]);
    expect(logged).toEqual(["edgeloop (workerd) auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)"]);
  });
});
