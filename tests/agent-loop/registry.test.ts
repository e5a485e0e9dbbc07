import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { AgentLoopRegistry, parseAgentLoopConfig, runAgentLoop } from "../../shared/agent-loop/registry.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { AgentLoop } from "../../shared/agent-loop/agent-loop.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { call, config, ctxOf, FakeTools, GEN_PROMPT, IM_END, ScriptedClient, SP } from "./helpers.ts";

let tok: ChatTokenizer;
let server: ToolServer;
beforeAll(async () => {
  tok = await defaultTokenizer();
  server = startToolServer({ secret: "loop-secret" });
});
afterAll(() => server.stop());

const prompt = [{ role: "user" as const, content: "hi" }];

describe("C14: agent routing", () => {
  const cases: Array<[string, Record<string, unknown>, string]> = [
    ["absent", {}, "single"],
    ["null", { agent_name: null }, "single"],
    ["tool_agent", { agent_name: "tool_agent" }, "tool"],
  ];
  for (const [label, fields, expected] of cases) {
    test(`agent_name ${label} → ${expected}`, async () => {
      const client = new ScriptedClient(tok, [{ text: "ok" }]);
      const tools = new FakeTools(["calc"], () => "1");
      const [o] = await runAgentLoop(defaultAgentLoopRegistry(), ctxOf(tok, client, config(), { tools }), SP, { uid: "u", session_id: 0, prompt, ...fields });
      // single_turn_agent renders without tools; tool_agent with them.
      const withTools = tok.renderIds(prompt, { tools: tools.schemas, addGenerationPrompt: true });
      const without = tok.renderIds(prompt, { addGenerationPrompt: true });
      expect(o!.prompt_ids).toEqual(expected === "tool" ? withTools : without);
      expect("terminated_by" in o!.extra_fields).toBe(expected === "tool");
    });
  }

  test("an unknown name fails the row before any request, listing the registered names", async () => {
    const client = new ScriptedClient(tok, []);
    const p = runAgentLoop(defaultAgentLoopRegistry(), ctxOf(tok, client, config()), SP, { uid: "u", session_id: 0, prompt, agent_name: "no_such_agent" });
    const err = await p.catch((e) => e);
    expect(err).toBeInstanceOf(InputError);
    expect(err.message).toBe("agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent");
    expect(err.field).toBe("agent_name");
    expect(client.requests.length).toBe(0);
  });

  test("default_agent_loop from the config", async () => {
    const client = new ScriptedClient(tok, [{ text: "ok" }]);
    const [o] = await runAgentLoop(defaultAgentLoopRegistry(), ctxOf(tok, client, config({ agent: { default_agent_loop: "tool_agent" } })), SP, { uid: "u", session_id: 0, prompt });
    expect(o!.extra_fields.terminated_by).toBe("model");
  });

  test("an unknown tool-call parser is a ConfigError at construction", () => {
    const client = new ScriptedClient(tok, []);
    expect(() => new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { format: "nope" } })))).toThrow(ConfigError);
  });
});

describe("custom loops from agent.agent_loop_config_path", () => {
  const configUrl = new URL("./fixtures/agent-loops.yaml", import.meta.url);

  test("loaded with dynamic import, relative to the config file; runs end to end", async () => {
    const reg = defaultAgentLoopRegistry();
    await reg.loadConfig(parseAgentLoopConfig(await Bun.file(configUrl).text()), { baseUrl: configUrl.href });
    expect(reg.names()).toEqual(["openai_agent", "openenv_agent", "self_check_agent", "single_turn_agent", "tool_agent"]);
    const client = new ScriptedClient(tok, [{ text: "#### 5" }, { text: "#### 4" }]);
    const [o] = await runAgentLoop(reg, ctxOf(tok, client, config()), SP, {
      uid: "u",
      session_id: 1,
      prompt: [{ role: "user", content: "2+2?" }],
      agent_name: "self_check_agent",
      reward_model: { style: "rule", ground_truth: 4 },
    });
    expect(o!.num_turns).toBe(4);
    expect(o!.reward_score).toBe(1);
    expect(client.requests.map((r) => r.routing_key)).toEqual(["u_1_0", "u_1_0"]);
    const check = tok.encode("Check your answer. Reply with the final number after ####.");
    expect(o!.response_ids).toEqual([...tok.encode("#### 5"), IM_END, 198, 151644, 872, 198, ...check, IM_END, 198, ...GEN_PROMPT, ...tok.encode("#### 4"), IM_END]);
  });

  test("factories and bad entries", async () => {
    class Mine extends AgentLoop {
      async run() {
        return [] as never;
      }
    }
    const reg = new AgentLoopRegistry();
    await reg.loadConfig([{ name: "f", module: "m", export: "make" }, { name: "c", module: "m", export: "Mine" }], {
      importModule: async () => ({ make: (ctx: any) => new Mine(ctx), Mine }),
    });
    expect(reg.names()).toEqual(["c", "f"]);
    const bad = reg.loadConfig([{ name: "x", module: "m", export: "nothing" }], { importModule: async () => ({}) });
    await expect(bad).rejects.toThrow("config agent.agent_loop_config_path[0].export: 'm' has no function or class export 'nothing' for agent loop 'x'");
    const missing = reg.loadConfig([{ name: "x", module: "./does-not-exist.ts", export: "X" }], { baseUrl: configUrl.href });
    await expect(missing).rejects.toBeInstanceOf(ConfigError);
    expect(() => parseAgentLoopConfig("- {name: a}", "loops.yaml")).toThrow("config loops.yaml: [0].module: Invalid input: expected string, received undefined");
    expect(parseAgentLoopConfig("agent_loops:\n  - {name: a, module: ./a.ts}")).toEqual([{ name: "a", module: "./a.ts", export: "default" }]);
    expect(() => parseAgentLoopConfig("- {name: a, module: ./a.ts, extra: 1}", "loops.yaml")).toThrow('config loops.yaml: [0]: Unrecognized key: "extra"');
    expect(() => parseAgentLoopConfig("- {name: a, module: ./a.ts}\n- {name: b, module: ./b.ts}\n- {name: a, module: ./c.ts}", "loops.yaml")).toThrow(
      "config loops.yaml: [2].name: 'a' is already the name of entry [0]: each agent loop name may appear once",
    );
  });
});

describe("tool_agent with the example tool server over loopback", () => {
  test("calc through a signed webhook; the observation holds the server's answer", async () => {
    const text = await Bun.file(new URL("../../infra/tools/tools.example.json", import.meta.url)).text();
    const tools = new WebhookToolClient(parseToolsFile(text, { vars: { port: server.port } }).tools, { secret: "loop-secret" });
    const a1 = call("calc", { expression: "(3 + 4) * 6" });
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "#### 42" }]);
    const [o] = await runAgentLoop(defaultAgentLoopRegistry(), ctxOf(tok, client, config(), { tools }), SP, {
      uid: "e2e",
      session_id: 0,
      agent_name: "tool_agent",
      prompt: [{ role: "user", content: "What is (3 + 4) * 6?" }],
      reward_model: { style: "rule", ground_truth: "42" },
    });
    const conv = [
      { role: "user" as const, content: "What is (3 + 4) * 6?" },
      { role: "assistant" as const, content: a1 },
      { role: "tool" as const, content: "42" },
    ];
    expect(client.requests[1]!.prompt_ids).toEqual(tok.renderIds(conv, { tools: [...tools.schemas], addGenerationPrompt: true }));
    expect([o!.num_turns, o!.reward_score, o!.extra_fields.tool_errors]).toEqual([4, 1, 0]);
    const stats = (await (await fetch(`${server.url}/stats`)).json()) as { by_tool: Record<string, number> };
    expect(stats.by_tool.calc).toBe(1);
  });
});
