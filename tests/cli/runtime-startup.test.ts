import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { resolveConfigPaths } from "../../infra/cli/files.ts";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { checkRedis, maskRedisUrl } from "../../infra/redis/redis-check.ts";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { AuthError, ConfigError, StoreError } from "../../shared/errors.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";

const EX = join(import.meta.dir, "..", "..", "examples");
const tmp = mkdtempSync(join(tmpdir(), "edgeloop-startup-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const ROW = { prompt: [{ role: "user", content: "What is 2+2?" }] };

describe("start-up checks of the store", () => {
  test("an unreachable Redis fails at once with the masked URL (no reconnect loop)", async () => {
    const e = await checkRedis("redis://user:s3cret@127.0.0.1:1/0", { what: "--store" }).catch((x) => x);
    expect(e).toBeInstanceOf(StoreError);
    expect(e.message).toBe("cannot reach Redis at redis://user:***@127.0.0.1:1/0 (--store): connect ECONNREFUSED 127.0.0.1:1");
    const r = await buildRuntime({ store: "redis://127.0.0.1:1" }).catch((x) => x);
    expect(r).toBeInstanceOf(StoreError);
    expect(r.message).toBe("cannot reach Redis at redis://127.0.0.1:1 (store.url / --store): connect ECONNREFUSED 127.0.0.1:1");
  });

  test("maskRedisUrl hides the password, or a lone user", () => {
    expect(maskRedisUrl("redis://:pw@h:1")).toBe("redis://:***@h:1");
    expect(maskRedisUrl("rediss://default:pw@h:6380/2")).toBe("rediss://default:***@h:6380/2");
    expect(maskRedisUrl("redis://token@h:1")).toBe("redis://***@h:1");
    expect(maskRedisUrl("redis://127.0.0.1:6379")).toBe("redis://127.0.0.1:6379");
  });

  test("an Upstash endpoint that refuses the token is an AuthError; an unreachable one a StoreError", async () => {
    if (!(await requireRedis())) return;
    const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: "good" });
    const env = { url: process.env.UPSTASH_REDIS_REST_URL, token: process.env.UPSTASH_REDIS_REST_TOKEN };
    try {
      process.env.UPSTASH_REDIS_REST_URL = bridge.url;
      process.env.UPSTASH_REDIS_REST_TOKEN = "bad";
      const e = await buildRuntime({ store: "upstash" }).catch((x) => x);
      expect(e).toBeInstanceOf(AuthError);
      expect(e.message).toBe(`the Upstash store at ${bridge.url} refused the token (401 Unauthorized): check UPSTASH_REDIS_REST_TOKEN`);
      process.env.UPSTASH_REDIS_REST_URL = "http://127.0.0.1:1";
      const u = await buildRuntime({ store: "upstash" }).catch((x) => x);
      expect(u).toBeInstanceOf(StoreError);
      expect(u.message).toStartWith("cannot reach the Upstash store at http://127.0.0.1:1 (UPSTASH_REDIS_REST_URL): ");
    } finally {
      for (const [k, v] of [["UPSTASH_REDIS_REST_URL", env.url], ["UPSTASH_REDIS_REST_TOKEN", env.token]] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      await bridge.stop();
    }
  });

  test("IoRedisCommander reports a lost connection once, gives up after maxReconnects, and commands fail instead of hanging", async () => {
    const seen: string[] = [];
    const c = new IoRedisCommander("redis://:pw@127.0.0.1:1", { maxReconnects: 2, onError: (m) => seen.push(m) });
    const e = await c.exec(["PING"]).catch((x) => x);
    expect(e).toBeInstanceOf(Error);
    await new Promise<void>((resolve) => {
      const t = setInterval(() => seen.length >= 2 && (clearInterval(t), resolve()), 20);
    });
    await c.close();
    expect(seen).toEqual([
      "Redis redis://:***@127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1 (reconnecting, up to 2 attempts)",
      "Redis redis://:***@127.0.0.1:1: gave up reconnecting; commands fail until restart",
    ]);
  });
});

describe("names that must be registered fail at start", () => {
  test("rollout.agent.default_agent_loop and rollout.multi_turn.format", async () => {
    const a = await buildRuntime({ defaultAgent: "nope" }).catch((x) => x);
    expect(a).toBeInstanceOf(ConfigError);
    expect(a.message).toBe("config rollout.agent.default_agent_loop: unknown agent loop 'nope'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent");
    const cfg = join(tmp, "xml.yaml");
    writeFileSync(cfg, "rollout:\n  multi_turn:\n    format: xml\n");
    const f = await buildRuntime({ config: cfg }).catch((x) => x);
    expect(f).toBeInstanceOf(ConfigError);
    expect(f.message).toBe("config rollout.multi_turn.format: unknown tool-call parser 'xml'; registered parsers: deepseek_v3, harmony, hermes, llama3_json, pythonic, qwen3_coder");
  });

  test("per-batch config over HTTP: 400 before anything is planned (inline mode)", async () => {
    const rt = await buildRuntime({});
    try {
      const app = createRolloutsApp({ service: rt.service });
      const post = (config: unknown) =>
        app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [ROW], config }) });
      const r1 = await post({ rollout: { multi_turn: { format: "xml" } } });
      expect(r1.status).toBe(400);
      expect(await r1.json()).toEqual({
        error: { code: "invalid_config", message: "config rollout.multi_turn.format: unknown tool-call parser 'xml'; registered parsers: deepseek_v3, harmony, hermes, llama3_json, pythonic, qwen3_coder", field: "rollout.multi_turn.format" },
      });
      const r2 = await post({ rollout: { agent: { default_agent_loop: "nope" } } });
      expect(r2.status).toBe(400);
      expect(((await r2.json()) as { error: { field: string } }).error.field).toBe("rollout.agent.default_agent_loop");
      expect(rt.service.batchIds()).toEqual([]);
    } finally {
      await rt.close();
    }
  });

  test("per-batch config over HTTP: 400 with nothing written (queue mode, Redis)", async () => {
    if (!(await requireRedis())) return;
    const prefix = randomPrefix("cli-startup");
    const rt = await buildRuntime({ store: REDIS_URL, storePrefix: prefix }, { jobs: "queue" });
    const raw = rawRedis();
    try {
      const app = createRolloutsApp({ service: rt.service });
      const r = await app.request("/v1/rollouts", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ rows: [ROW], config: { rollout: { agent: { default_agent_loop: "nope" } } } }),
      });
      expect(r.status).toBe(400);
      expect(((await r.json()) as { error: { message: string } }).error.message).toBe(
        "config rollout.agent.default_agent_loop: unknown agent loop 'nope'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
      );
      expect(await raw.keys(`${prefix}*`)).toEqual([]);
    } finally {
      await raw.quit();
      await rt.close();
      await deleteByPrefix(prefix);
    }
  });
});

describe("paths inside a config file are relative to the file", () => {
  test("resolveConfigPaths: engine.script, tools.file, agent_loop_config_path, model; absolute paths, qwen3 and flags untouched", () => {
    const cfg = join(tmp, "sub", "cfg.yaml");
    const raw = {
      engine: { script: "policy.json", url: "sim" },
      tools: { file: "../tools.json" },
      rollout: { n: 2, agent: { agent_loop_config_path: "loops.yaml" } },
      model: "models/q",
    };
    expect(resolveConfigPaths(raw, cfg)).toEqual({
      engine: { script: join(tmp, "sub", "policy.json"), url: "sim" },
      tools: { file: join(tmp, "tools.json") },
      rollout: { n: 2, agent: { agent_loop_config_path: join(tmp, "sub", "loops.yaml") } },
      model: join(tmp, "sub", "models", "q"),
    });
    expect(resolveConfigPaths({ model: "qwen3", engine: { script: "/abs/p.json" } }, cfg)).toEqual({ model: "qwen3", engine: { script: "/abs/p.json" } });
    expect(raw.engine.script).toBe("policy.json");
  });

  test("buildRuntime reads the script and tools file next to the config, whatever the cwd", async () => {
    const dir = join(tmp, "conf");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "policy.json"), await Bun.file(join(EX, "policy.json")).text());
    writeFileSync(join(dir, "tools.json"), JSON.stringify({
        tools: [{ name: "calc", url: "http://127.0.0.1:9/tools/calc", schema: { type: "function", function: { name: "calc", description: "c", parameters: { type: "object", properties: {} } } } }],
      }));
    writeFileSync(join(dir, "cfg.yaml"), "engine:\n  script: policy.json\ntools:\n  file: tools.json\n");
    const rt = await buildRuntime({ config: join(dir, "cfg.yaml") });
    try {
      expect(rt.describe).toContain(`engine     simulated, in-process (script ${join(dir, "policy.json")})`);
      expect(rt.describe).toContain(`tools      calc from ${join(dir, "tools.json")}`);
    } finally {
      await rt.close();
    }
  });
});
