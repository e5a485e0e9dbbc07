import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { AgentWebhookError, OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { buildRuntime, unsignedAgentWarning } from "../../infra/cli/runtime.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { answering, countingTarget, hugeReply, redirecting } from "../helpers/hostile-servers.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";

// Issue 26 for the agent task webhook: S1 (a redirect is never followed: the task carries the session's
// api_key), S2 (its answer is read under a cap), S13 (errors name it without the query), S20 (unsigned warning).
const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
const target = countingTarget();
const stops: (() => void)[] = [() => target.stop()];
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(() => {
  for (const s of stops) s();
});

function loopFor(url: string) {
  const engine = new SimEngine({ tokenizer: tok, script });
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096, pollMs: 20 });
  // No fetch injected: the global fetch, through the outbound helper, against real loopback servers.
  const link: AgentGatewayLink = { gateway: gw, publicUrl: () => "http://edgeloop.local", agent: { url, timeout_ms: 30_000, secret: "s" } };
  return new OpenAIAgentLoop(ctxOf(tok, new SimEngineClient(engine), config(), { reward: {}, agentGateway: link }));
}

describe("agent task webhook bounds", () => {
  test("a 307 to a loopback target fails the trajectory at once naming 307; the target never sees the task (nor its api_key)", async () => {
    const r = redirecting(307, target.url);
    stops.push(r.stop);
    const err = await loopFor(`${r.base}/tasks?token=SECRET`).run(SP, { uid: "r0", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentWebhookError);
    expect(err.message).toBe(`agent webhook ${r.base}/tasks: answered HTTP 307 (a redirect; redirects are not followed)`);
    expect(target.hits()).toBe(0);
  });
  test("an agent answering 200 with 300 MB: fails naming the 4 MiB cap", async () => {
    const huge = hugeReply(300 * 1024 * 1024);
    stops.push(huge.stop);
    const err = await loopFor(`${huge.base}/tasks?token=SECRET`).run(SP, { uid: "r1", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err).toBeInstanceOf(AgentWebhookError);
    expect(err.message).toBe(`agent webhook ${huge.base}/tasks: reply larger than 4194304 bytes (the cap)`);
  });
  test("an agent refusing with 400: the error names the webhook without its query string", async () => {
    const a = answering(400, { error: "no" });
    stops.push(a.stop);
    const err = await loopFor(`${a.base}/tasks?token=SECRET`).run(SP, { uid: "r2", session_id: 0, prompt: row0.prompt }).catch((e) => e);
    expect(err.message).toBe(`agent webhook ${a.base}/tasks answered 400: {"error":"no"}`);
  });
});

describe("S20: unsigned agent tasks are warned about at start", () => {
  const WARNING =
    "warning    agent tasks are sent unsigned (no agent.secret): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set --agent-secret (the agent must verify x-edgeloop-signature with it)";
  test("the warning with agent.url and no secret; none with a secret or without an agent", () => {
    expect(unsignedAgentWarning(parseAppConfig({ agent: { url: "http://127.0.0.1:9/tasks" } }))).toBe(WARNING);
    expect(unsignedAgentWarning(parseAppConfig({ agent: { url: "http://127.0.0.1:9/tasks", secret: "s" } }))).toBeNull();
    expect(unsignedAgentWarning(parseAppConfig({}))).toBeNull();
  });
  test("buildRuntime lists it among its warnings, and its start line names the webhook without the query", async () => {
    const rt = await buildRuntime({ agent: "http://127.0.0.1:9/tasks?token=SECRET" });
    try {
      expect(rt.warnings).toContain(WARNING);
      expect(rt.describe.filter((l) => l.startsWith("agent "))).toEqual(["agent      openai_agent tasks to http://127.0.0.1:9/tasks (timeout 600000 ms)"]);
      expect([...rt.describe, ...rt.warnings].join("\n")).not.toContain("SECRET");
    } finally {
      await rt.close();
    }
    const signed = await buildRuntime({ agent: "http://127.0.0.1:9/tasks", agentSecret: "s" });
    try {
      expect(signed.warnings.filter((w) => w.includes("agent tasks"))).toEqual([]);
    } finally {
      await signed.close();
    }
  });
});
