import { describe, expect, test } from "bun:test";
import { agentSettings, type Env } from "../../infra/cloudflare/env.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";

const env = (v: Partial<Env>) => v as Env;

describe("Worker env: the agent gateway's variables", () => {
  test("EDGELOOP_AGENT_* and EDGELOOP_PUBLIC_URL over the config's agent section", () => {
    const cfg = parseAppConfig({ agent: { url: "http://cfg/tasks", timeout_ms: 5000, secret: "s0", public_url: "http://cfg-public" } }, "t");
    expect(agentSettings(env({}), cfg)).toEqual({ agent: { url: "http://cfg/tasks", timeout_ms: 5000, secret: "s0" }, publicUrl: "http://cfg-public" });
    expect(agentSettings(env({ EDGELOOP_AGENT_URL: "https://a.example/t", EDGELOOP_AGENT_SECRET: "s1", EDGELOOP_AGENT_TIMEOUT_MS: "1200", EDGELOOP_PUBLIC_URL: "https://w.example/" }), cfg)).toEqual({
      agent: { url: "https://a.example/t", timeout_ms: 1200, secret: "s1" },
      publicUrl: "https://w.example",
    });
    expect(agentSettings(env({}), parseAppConfig({}, "t"))).toEqual({ agent: { url: null, timeout_ms: 600_000, secret: null }, publicUrl: null });
  });

  test("a bad value is a ConfigError naming the variable", () => {
    const cfg = parseAppConfig({}, "t");
    expect(() => agentSettings(env({ EDGELOOP_AGENT_TIMEOUT_MS: "10s" }), cfg)).toThrow("config EDGELOOP_AGENT_TIMEOUT_MS: must be a positive integer (milliseconds), got '10s'");
    expect(() => agentSettings(env({ EDGELOOP_PUBLIC_URL: "edgeloop.workers.dev" }), cfg)).toThrow("config EDGELOOP_PUBLIC_URL: must be an http(s) URL, got 'edgeloop.workers.dev'");
    expect(() => agentSettings(env({ EDGELOOP_AGENT_URL: "ftp://x/y" }), cfg)).toThrow("config EDGELOOP_AGENT_URL: must be an http(s) URL, got 'ftp://x/y'");
  });
});
