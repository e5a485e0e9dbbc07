import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { OpenEnvAgentLoop, firstJsonObject, observationText, openEnvSettingsFor } from "../../shared/agent-loop/openenv-agent.ts";
import { OpenEnvError } from "../../shared/agent-loop/openenv-client.ts";
import { runAgentLoop } from "../../shared/agent-loop/registry.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { OpenEnvSettings, type OpenEnvSettingsInput } from "../../shared/schema/openenv.ts";
import type { ChatMessage, TokenOutput } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, ctxOf, GEN_PROMPT, IM_END, LP, maskRuns, ScriptedClient, SP } from "./helpers.ts";
import { startOpenEnvServer, type OpenEnvTestServer } from "./openenv-server.ts";

let tok: ChatTokenizer;
let servers: OpenEnvTestServer[] = [];
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()));
});

function server(opts: Parameters<typeof startOpenEnvServer>[0] = {}): OpenEnvTestServer {
  const s = startOpenEnvServer(opts);
  servers.push(s);
  return s;
}

const settings = (over: OpenEnvSettingsInput = {}) => ({ settings: OpenEnvSettings.parse(over) });

const USER: ChatMessage = { role: "user", content: "Play the game. Answer with one number." };
const row = (extra: Record<string, unknown> = {}) => ({ uid: "u1", session_id: 0, data_source: "openenv", prompt: [USER], extra_info: { openenv: { reset_kwargs: { seed: 6 } } }, ...extra });

/** The observation tokens after an assistant turn ended by `<|im_end|>`: separator, a user turn with `text`, the generation prompt. */
const userObs = (text: string) => [198, 151644, 872, 198, ...tok.encode(text), IM_END, 198, ...GEN_PROMPT];
const turn = (text: string) => [...tok.encode(text), IM_END];

describe("openenv_agent over HTTP: guess-the-number, token-exact", () => {
  test("reset → prompt; one step per turn; observations mask 0; rewards into turn_scores; ends on done", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "5" }, { text: "8" }, { text: "7" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, transport: "http", observation: { field: "prompt" } }) }));
    const o = await loop.run(SP, row());

    // The reset observation (its `prompt` field) is a user turn after the row's prompt.
    const conv: ChatMessage[] = [USER, { role: "user", content: "Guess the number (1-10)." }];
    expect(o.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    expect(maskRuns(o)).toEqual([
      [1, turn("5")],
      [0, userObs("Higher.")],
      [1, turn("8")],
      [0, userObs("Lower.")],
      [1, turn("7")],
    ]);
    const lps = o.response_mask.map((m) => (m === 1 ? LP : 0));
    expect(o.response_logprobs).toEqual(lps);
    // Every engine request is the template's own render of the conversation so far.
    conv.push({ role: "assistant", content: "5" }, { role: "user", content: "Higher." });
    expect(client.requests[1]!.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    conv.push({ role: "assistant", content: "8" }, { role: "user", content: "Lower." });
    expect(client.requests[2]!.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    expect([...o.prompt_ids, ...o.response_ids]).toEqual([...tok.renderIds(conv, { addGenerationPrompt: true }), ...turn("7")]);

    expect(o.extra_fields).toEqual({
      turn_scores: [-0.25, -0.25, 1],
      tool_rewards: [],
      env_steps: 3,
      invalid_actions: 0,
      terminated_by: "env_done",
      openenv: { url: env.url, transport: "http" },
    });
    expect(o.reward_score).toBe(0.5);
    expect(o.finish_reason).toBe("stop");
    expect(o.truncated).toBe(false);
    // 3 observations (the final "Correct!" counted, not appended) + 3 assistant turns + 1.
    expect(o.num_turns).toBe(7);
    expect(loop.trace).toEqual(["pending", "generating", "processing_tools", "generating", "processing_tools", "generating", "processing_tools", "terminated"]);
    // Exactly one reset and one step per turn, with the protocol's bodies.
    expect(env.log.http).toEqual([
      { method: "POST", path: "/reset", body: { episode_id: "u1_0_0", seed: 6 } },
      { method: "POST", path: "/step", body: { action: { message: "5" }, request_id: "u1_0_0:1" } },
      { method: "POST", path: "/step", body: { action: { message: "8" }, request_id: "u1_0_0:2" } },
      { method: "POST", path: "/step", body: { action: { message: "7" }, request_id: "u1_0_0:3" } },
    ]);
    expect(env.steps()).toBe(3);
  });

  test("reward: last; JSON observation text by default; max_assistant_turns stops after that turn's step", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "1" }, { text: "2" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_assistant_turns: 2 } }), { openenv: settings({ base_url: env.url, transport: "http", reward: "last" }) }));
    const o = await loop.run(SP, row());
    const resetText = JSON.stringify({ prompt: "Guess the number (1-10).", attempts_left: 3 });
    expect(o.prompt_ids).toEqual(tok.renderIds([USER, { role: "user", content: resetText }], { addGenerationPrompt: true }));
    expect(maskRuns(o)).toEqual([
      [1, turn("1")],
      [0, userObs(JSON.stringify({ prompt: "Higher.", attempts_left: 2 }))],
      [1, turn("2")],
    ]);
    expect(env.steps()).toBe(2);
    expect(o.extra_fields.turn_scores).toEqual([-0.25, -0.25]);
    expect(o.extra_fields.terminated_by).toBe("max_assistant_turns");
    expect(o.reward_score).toBe(-0.25);
    expect(o.num_turns).toBe(4);
  });

  test("action format json, the reset merged into the prompt, tool-role observations; an invalid action gets an error turn and no step", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "I think five." }, { text: 'Final: {"message": "7"}' }]);
    const loop = new OpenEnvAgentLoop(
      ctxOf(tok, client, config(), {
        openenv: settings({ base_url: env.url, transport: "http", action: { format: "json" }, observation: { field: "prompt", reset: "merge", role: "tool" } }),
      }),
    );
    const o = await loop.run(SP, row());
    // Merged: one user message holding the row's text and the reset observation.
    expect(o.prompt_ids).toEqual(tok.renderIds([{ role: "user", content: `${USER.content}\n\nGuess the number (1-10).` }], { addGenerationPrompt: true }));
    const err = "Error: no JSON object in the reply; answer with the action as one JSON object.";
    expect(maskRuns(o)).toEqual([
      [1, turn("I think five.")],
      [0, [198, 151644, 872, 198, 151665, ...tok.encode(`\n${err}\n`), 151666, IM_END, 198, ...GEN_PROMPT]],
      [1, turn('Final: {"message": "7"}')],
    ]);
    expect(env.log.http.filter((h) => h.path === "/step").map((h) => h.body)).toEqual([{ action: { message: "7" }, request_id: "u1_0_0:2" }]);
    expect(o.extra_fields).toMatchObject({ turn_scores: [1], env_steps: 1, invalid_actions: 1, terminated_by: "env_done" });
    expect(o.reward_score).toBe(1);
    expect(o.num_turns).toBe(5);
  });

  test("action format json with on_invalid: end stops at the first turn without an action (no step)", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "no idea" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, transport: "http", action: { format: "json", on_invalid: "end" } }) }));
    const o = await loop.run(SP, row());
    expect(o.response_ids).toEqual(turn("no idea"));
    expect(o.extra_fields).toMatchObject({ turn_scores: [], env_steps: 0, invalid_actions: 1, terminated_by: "invalid_action" });
    expect(o.reward_score).toBe(0);
    expect(env.steps()).toBe(0);
  });
});

describe("openenv_agent over WebSocket", () => {
  test("the same episode over /ws: the same tokens; reset, one step per turn and close on one connection", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "5" }, { text: "8" }, { text: "7" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, observation: { field: "prompt" } }) }));
    const o = await loop.run(SP, row());
    expect(maskRuns(o)).toEqual([
      [1, turn("5")],
      [0, userObs("Higher.")],
      [1, turn("8")],
      [0, userObs("Lower.")],
      [1, turn("7")],
    ]);
    expect(o.prompt_ids).toEqual(tok.renderIds([USER, { role: "user", content: "Guess the number (1-10)." }], { addGenerationPrompt: true }));
    expect(o.extra_fields).toMatchObject({ turn_scores: [-0.25, -0.25, 1], env_steps: 3, terminated_by: "env_done", openenv: { url: env.url, transport: "websocket" } });
    expect(o.reward_score).toBe(0.5);
    await env.until((l) => l.wsClosed === 1);
    expect(env.log.wsOpened).toBe(1);
    expect(env.log.http).toEqual([]);
    expect(env.log.ws).toEqual([
      { conn: 0, msg: { type: "reset", data: { episode_id: "u1_0_0", seed: 6 } } },
      { conn: 0, msg: { type: "step", data: { message: "5" } } },
      { conn: 0, msg: { type: "step", data: { message: "8" } } },
      { conn: 0, msg: { type: "step", data: { message: "7" } } },
      { conn: 0, msg: { type: "close" } },
    ]);
  });

  test("Gymnasium-style flags: truncated ends as env_truncated, terminated as env_terminated", async () => {
    const env = server({ gymFlags: true, maxAttempts: 2 });
    const lose = await new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: "1" }, { text: "2" }]), config(), { openenv: settings({ base_url: env.url }) })).run(SP, row());
    expect(lose.extra_fields).toMatchObject({ turn_scores: [-0.25, -0.25], terminated_by: "env_truncated" });
    expect(lose.finish_reason).toBe("stop");
    expect(lose.truncated).toBe(false);
    const win = await new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: "7" }]), config(), { openenv: settings({ base_url: env.url }) })).run(SP, row());
    expect(win.extra_fields).toMatchObject({ turn_scores: [1], terminated_by: "env_terminated" });
    await env.until((l) => l.wsClosed === 2);
  });

  test("a reset that is already done ends the trajectory before any engine call", async () => {
    const env = server({ doneAtReset: true });
    const client = new ScriptedClient(tok, []);
    const o = await new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url }) })).run(SP, row());
    expect(client.requests).toEqual([]);
    expect(o.response_ids).toEqual([]);
    expect(o.extra_fields).toMatchObject({ turn_scores: [], env_steps: 0, terminated_by: "env_done" });
    expect(o.num_turns).toBe(1);
  });

  test("action format tool_call: the tool is in the prompt, the first call's arguments are the action", async () => {
    const env = server();
    const guessTool = { type: "function" as const, function: { name: "guess", description: "make a guess", parameters: { type: "object" as const, properties: { message: { type: "string" } }, required: ["message"] } } };
    const a1 = '<tool_call>\n{"name": "guess", "arguments": {"message": "7"}}\n</tool_call>';
    const client = new ScriptedClient(tok, [{ text: a1 }]);
    const o = await new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, action: { format: "tool_call", tools: [guessTool] } }) })).run(SP, row());
    expect(o.prompt_ids).toEqual(tok.renderIds([USER, { role: "user", content: JSON.stringify({ prompt: "Guess the number (1-10).", attempts_left: 3 }) }], { tools: [guessTool], addGenerationPrompt: true }));
    await env.until((l) => l.wsClosed === 1);
    expect(env.log.ws.map((w) => w.msg)).toEqual([{ type: "reset", data: { episode_id: "u1_0_0", seed: 6 } }, { type: "step", data: { message: "7" } }, { type: "close" }]);
    expect(o.reward_score).toBe(1);
  });
});

describe("openenv_agent: environment failures fail the trajectory, naming the URL", () => {
  const fails = async (opts: Parameters<typeof startOpenEnvServer>[0], over: OpenEnvSettingsInput): Promise<OpenEnvError> => {
    const env = server(opts);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: "5" }]), config(), { openenv: settings({ base_url: env.url, ...over }) }));
    const e = await loop.run(SP, row()).then(
      () => null,
      (err: unknown) => err,
    );
    expect(e).toBeInstanceOf(OpenEnvError);
    return Object.assign(e as OpenEnvError, { url: env.url });
  };

  test("HTTP: a 500, a reply that is not JSON, a reply of the wrong shape, a step past the deadline", async () => {
    let e = await fails({ stepStatus: 500 }, { transport: "http" });
    const url = (e as unknown as { url: string }).url;
    expect(e.message).toBe(`openenv ${url} POST /step: answered HTTP 500: ${JSON.stringify('{"detail":"boom"}')}`);
    expect(e.code).toBe("openenv_status");
    e = await fails({ stepBody: "not json" }, { transport: "http" });
    expect(e.message).toBe(`openenv ${(e as unknown as { url: string }).url} POST /step: reply is not JSON: "not json"`);
    e = await fails({ stepBody: '{"observation": 5, "done": false}' }, { transport: "http" });
    expect(e.message).toBe(`openenv ${(e as unknown as { url: string }).url} POST /step: reply observation: expected an object`);
    e = await fails({ hangStep: true }, { transport: "http", timeout_ms: 200 });
    expect(e.message).toBe(`openenv ${(e as unknown as { url: string }).url} POST /step: timed out after 200 ms`);
    expect(e.code).toBe("openenv_timeout");
  });

  test("WebSocket: a server error message, a step past the deadline, a server that is gone", async () => {
    let e = await fails({ wsStepError: true }, {});
    const ws = (e as unknown as { url: string }).url.replace("http://", "ws://") + "/ws";
    expect(e.message).toBe(`openenv ${ws} step: server error: the environment crashed (code EXECUTION_ERROR)`);
    e = await fails({ hangStep: true }, { timeout_ms: 200 });
    expect(e.message).toBe(`openenv ${(e as unknown as { url: string }).url.replace("http://", "ws://")}/ws step: no reply within 200 ms`);
    const gone = server();
    await gone.stop();
    const loop = new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, []), config(), { openenv: settings({ base_url: gone.url }) }));
    const err = (await loop.run(SP, row()).catch((x: unknown) => x)) as OpenEnvError;
    expect(err).toBeInstanceOf(OpenEnvError);
    expect(err.message.startsWith(`openenv ${gone.url.replace("http://", "ws://")}/ws: `)).toBe(true);
  });

  test("WebSocket: a second reply no request asked for fails the trajectory at its next step (it was read as that step's reply)", async () => {
    const env = server({ wsDoubleReply: true });
    // The second turn is sampled only once the client has seen the extra message and closed the connection (the server
    // counts the close): the order is fixed by events, whatever the machine's load.
    const client = new ScriptedClient(tok, [{ text: "5" }, { text: "8" }]);
    const gen = client.generate.bind(client);
    let calls = 0;
    client.generate = async (req) => {
      if (++calls === 2) await env.until((log) => log.wsClosed >= 1);
      return gen(req);
    };
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url }) }));
    const e = (await loop.run(SP, row()).catch((x: unknown) => x)) as OpenEnvError;
    expect(e).toBeInstanceOf(OpenEnvError);
    const ws = `${env.url.replace("http://", "ws://")}/ws`;
    expect(e.message).toStartWith(`openenv ${ws}: sent a message no request asked for (the protocol answers each message with one): "{\\"type\\":\\"observation\\"`);
    expect(e.code).toBe("openenv_bad_reply");
    // The first step was answered; the second was never sent on the broken connection.
    expect(env.steps()).toBe(1);
  });

  test("step rewards whose sum overflows fail the trajectory naming the env, not as a record's reward_score: Infinity", async () => {
    const env = server({ stepReward: 1.7e308 });
    const loop = new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: "5" }, { text: "8" }, { text: "7" }]), config(), { openenv: settings({ base_url: env.url }) }));
    const e = (await loop.run(SP, row()).catch((x: unknown) => x)) as OpenEnvError;
    expect(e).toBeInstanceOf(OpenEnvError);
    expect(e.message).toBe(`openenv ${env.url}: the step rewards sum to Infinity (turn_scores [1.7e+308,1.7e+308,1.7e+308]): not a finite number`);
  });

  test("HTTP: a second episode on the same server while one runs fails (OpenEnv's HTTP form has one episode per server); after the first ends, a new one runs", async () => {
    const env = server();
    const mk = (script: { text: string }[]) => new OpenEnvAgentLoop(ctxOf(tok, new ScriptedClient(tok, script), config(), { openenv: settings({ base_url: env.url, transport: "http" }) }));
    // The first trajectory's engine holds its first turn until the second trajectory has tried to reset.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const slow = new ScriptedClient(tok, [{ text: "5" }, { text: "8" }, { text: "7" }]);
    const gen = slow.generate.bind(slow);
    slow.generate = async (req) => {
      await held;
      return gen(req);
    };
    const first = new OpenEnvAgentLoop(ctxOf(tok, slow, config(), { openenv: settings({ base_url: env.url, transport: "http" }) })).run(SP, row());
    await env.until((log) => log.http.some((r) => r.path === "/reset"));
    const e = (await mk([{ text: "5" }]).run(SP, row({ uid: "u2" })).catch((x: unknown) => x)) as OpenEnvError;
    expect(e).toBeInstanceOf(OpenEnvError);
    expect(e.code).toBe("openenv_episode_busy");
    expect(e.message).toStartWith(`openenv ${env.url}: another trajectory's episode is running on this server;`);
    release();
    const o = await first;
    expect(o.extra_fields.turn_scores).toEqual([-0.25, -0.25, 1]);
    // Only the first trajectory reset the server; once it ended, the next one runs.
    expect(env.log.http.filter((r) => r.path === "/reset").length).toBe(1);
    const next = await mk([{ text: "5" }, { text: "8" }, { text: "7" }]).run(SP, row({ uid: "u3" }));
    expect(next.extra_fields.turn_scores).toEqual([-0.25, -0.25, 1]);
  });

  test("through a batch: the row whose environment fails is a failed trajectory with that reason; the other row is unaffected", async () => {
    const good = server();
    const bad = server({ stepStatus: 503 });
    const rollout = config({ n: 1 });
    const rows = [
      { uid: "ok", agent_name: "openenv_agent", prompt: [USER], extra_info: { openenv: { base_url: good.url, transport: "http" } } },
      { uid: "ko", agent_name: "openenv_agent", prompt: [USER], extra_info: { openenv: { base_url: bad.url, transport: "http" } } },
    ];
    const plan = planBatch(RolloutRequest.parse({ rows }), rollout);
    const registry = defaultAgentLoopRegistry();
    const client = new EchoGuesses(tok, ["7"]);
    const run = new BatchRun(plan, {
      store: new MemoryTransferQueue(),
      rollout,
      concurrency: 2,
      executor: {
        agentNameFor: (t) => t.row!.agent_name!,
        run: async (t) => ({ agentName: "openenv_agent", outputs: await runAgentLoop(registry, ctxOf(tok, client, rollout), SP, { ...t.row!, uid: t.uid, session_id: t.session_id }) }),
      },
    });
    await run.run();
    const byKey = new Map(run.records().map((r) => [r.key, r]));
    expect(byKey.get("ko_0_0")!.error).toBe(`OpenEnvError: openenv ${bad.url} POST /step: answered HTTP 503: ${JSON.stringify('{"detail":"boom"}')}`);
    expect(byKey.get("ok_0_0")!.error).toBeNull();
    expect(byKey.get("ok_0_0")!.reward_score).toBe(1);
    expect(good.steps()).toBe(1);
  });
});

describe("openenv_agent settings", () => {
  test("base_url sandbox without sandbox leases in the loop's context: ConfigError naming openenv.base_url, before any engine call", async () => {
    const client = new ScriptedClient(tok, [{ text: "7" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: "sandbox", transport: "http" }) }));
    const e = (await loop.run(SP, row()).catch((x) => x)) as ConfigError;
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.field).toBe("openenv.base_url");
    expect(e.message).toBe(`config openenv.base_url: "sandbox" plays each trajectory's own sandbox, but there are no sandbox leases: add a sandbox block to the tools file (tools.file), or set an environment URL`);
    expect(client.requests).toEqual([]);
    expect(OpenEnvSettings.parse({ base_url: "sandbox" }).base_url).toBe("sandbox");
    expect(openEnvSettingsFor(OpenEnvSettings.parse({}), { openenv: { base_url: "sandbox" } }).base_url).toBe("sandbox");
  });

  test("row overrides merge over the config; bad fields name extra_info.openenv.<field>", () => {
    const cfg = OpenEnvSettings.parse({ base_url: "http://env:8000", observation: { field: "prompt" } });
    const s = openEnvSettingsFor(cfg, { openenv: { transport: "http", observation: { role: "tool" }, reset_kwargs: { seed: 1 } } });
    expect(s).toMatchObject({ base_url: "http://env:8000", transport: "http", observation: { field: "prompt", role: "tool", reset: "append" }, reset_kwargs: { seed: 1 } });
    const bad = (extra: unknown) => {
      try {
        openEnvSettingsFor(cfg, extra);
      } catch (e) {
        expect(e).toBeInstanceOf(InputError);
        return (e as Error).message;
      }
      return "no error";
    };
    expect(bad({ openenv: { transport: "grpc" } })).toBe("extra_info.openenv.transport: must be 'http' or 'websocket'");
    expect(bad({ openenv: { base_url: "ftp://x" } })).toStartWith("extra_info.openenv.base_url: must be an http(s):// or ws(s):// URL");
    expect(bad({ openenv: { action: { format: "xml" } } })).toBe("extra_info.openenv.action.format: must be 'text', 'json' or 'tool_call'");
    expect(bad({ openenv: { bogus: 1 } })).toStartWith("extra_info.openenv: ");
    expect(() => openEnvSettingsFor(undefined, {})).toThrow("extra_info.openenv.base_url: no OpenEnv environment URL: set openenv.base_url in the config or extra_info.openenv.base_url in the row");
  });

  test("observation text and JSON actions", () => {
    expect(observationText({ prompt: "hi", n: 1 }, "prompt")).toBe("hi");
    expect(observationText({ a: { b: [1, { c: "x" }] } }, "a.b.1.c")).toBe("x");
    expect(observationText({ a: { b: 2 } }, "a")).toBe('{"b":2}');
    expect(observationText({ a: 1 }, "missing")).toBe('{"a":1}');
    expect(firstJsonObject('{"message": "7"}')).toEqual({ message: "7" });
    expect(firstJsonObject('Sure.\n```json\n{"code": "print(1)"}\n```')).toEqual({ code: "print(1)" });
    expect(firstJsonObject('a {broken} then {"x": "}"} end')).toEqual({ x: "}" });
    expect(firstJsonObject("no object [1, 2]")).toBeNull();
    // Hostile text: many unbalanced braces stay linear (bounded candidates).
    expect(firstJsonObject("{".repeat(100_000))).toBeNull();
  });
});

/** An engine that answers every request with the next guess of its list (cycling), the same for every trajectory. */
class EchoGuesses implements InferenceClient {
  private i = 0;
  constructor(
    private readonly t: ChatTokenizer,
    private readonly guesses: string[],
  ) {}
  async generate(_req: GenerateRequest): Promise<TokenOutput> {
    const ids = [...this.t.encode(this.guesses[this.i++ % this.guesses.length]!), IM_END];
    return { token_ids: ids, log_probs: ids.map(() => LP), finish_reason: "stop", num_preempted: -1, extra_fields: {} };
  }
}

