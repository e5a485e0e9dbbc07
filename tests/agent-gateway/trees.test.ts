/**
 * Trajectory trees on the agent gateway (issue 30 item 5), through the
 * official `openai` SDK (in-process: the SDK's `fetch` option calls the Hono
 * app), real Qwen3 tokenizer, sim engine: a session with a root, a branch
 * that rewrites a tool result, a re-ask of an earlier turn, and a sub-agent
 * given the parent's first messages and its own. Every branch's record is
 * the linear trajectory along its path, token for token; the stored log keeps
 * branches by reference and folds back to the same records.
 */
import { resolveTree, treeNodes } from "../../shared/store/tree-delivery.ts";
import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs, AgentSessionEvent, foldAgentSession, type TurnEvent } from "../../shared/agent-gateway/agent-session.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { outputOfRecord, toTrajectoryRecord, type PlannedTrajectory } from "../../shared/rollout/batch.ts";
import { decodeRecord, encodeRecord, validateAndEncode } from "../../shared/store/record-codec.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import type { AgentLoopOutput, ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { config, SP } from "../agent-loop/helpers.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l) as { prompt: ChatMessage[] });
const BASE = "http://edgeloop.local";
const TOKEN = "tok_0123456789abcdef0123";
const IM_END = 151645;
type Msg = OpenAI.ChatCompletionMessageParam;

let tok: ChatTokenizer;
let tools: ToolSchema[];

beforeAll(async () => {
  tok = await defaultTokenizer();
  // Only the schemas: the agent here answers the calls itself.
  tools = [...new WebhookToolClient(parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: 1 } }).tools).schemas];
});

function setup(storage = new MemorySessionStorage(), engine = new SimEngine({ tokenizer: tok, script })) {
  const gw = new AgentGateway({ storage, tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096, wallClockMs: () => 1_700_000_000_000 });
  const app = createAgentGatewayApp({ gateway: gw });
  const fetchApp = async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i));
  return { gw, storage, fetchApp, engine };
}

async function createSession(gw: AgentGateway, key: string, rollout = config()) {
  const now = 1_700_000_000_000;
  const [uid, sid] = key.split("_");
  return gw.create({ v: 1, key, uid: uid!, session_id: Number(sid), token: TOKEN, created_ms: now, deadline_ms: now + 600_000, sampling_params: SP, rollout, tools, messages: rows[3]!.prompt });
}

function sdk(fetchApp: ReturnType<typeof setup>["fetchApp"], key: string) {
  return new OpenAI({ baseURL: `${BASE}/v1/sessions/${key}/openai/v1`, apiKey: TOKEN, fetch: fetchApp, maxRetries: 0 });
}

/** One call; the reply's message as the agent sends it back. */
async function ask(client: OpenAI, messages: Msg[]): Promise<Msg & { tool_calls?: OpenAI.ChatCompletionMessageToolCall[] }> {
  const r = await client.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] });
  return r.choices[0]!.message as Msg & { tool_calls?: OpenAI.ChatCompletionMessageToolCall[] };
}

const toolMsg = (m: { tool_calls?: OpenAI.ChatCompletionMessageToolCall[] }, content: string): Msg => ({ role: "tool", tool_call_id: m.tool_calls![0]!.id, content });

/** The bytes of a session's turn events in its store (the input and the `open` event left out: every layout has them once). */
async function turnBytes(storage: MemorySessionStorage, key: string): Promise<number> {
  const s = (await storage.get(AgentGateway.storageKey(key)))!;
  return s.deltas.filter((d) => JSON.parse(d).e === "turn").reduce((n, d) => n + new TextEncoder().encode(d).length, 0);
}

/** A linear session along one path of the tree: `calls` made one after another in a fresh session; its one output and turn bytes. */
async function linear(key: string, calls: (c: OpenAI) => Promise<void>): Promise<{ out: AgentLoopOutput; bytes: number }> {
  const { gw, storage, fetchApp } = setup();
  await createSession(gw, key);
  await calls(sdk(fetchApp, key));
  const outs = agentOutputs((await gw.finish(key, { by: "agent", reward: 1 }))!, { reward: 1 });
  expect(outs.length).toBe(1);
  return { out: outs[0]!, bytes: await turnBytes(storage, key) };
}

const tokens = (o: AgentLoopOutput) => ({ prompt_ids: o.prompt_ids, response_ids: o.response_ids, response_mask: o.response_mask, response_logprobs: o.response_logprobs, num_turns: o.num_turns, truncated: o.truncated, finish_reason: o.finish_reason });

describe("trajectory trees", () => {
  test("two branches and a sub-agent: parent_key/branch_at, exact shared prefixes, each branch the linear trajectory of its path, fold and bytes", async () => {
    const KEY = "u0_0_0";
    const { gw, storage, fetchApp } = setup();
    await createSession(gw, KEY);
    const c = sdk(fetchApp, KEY);
    const M1 = rows[3]!.prompt as Msg[];
    // Output 0 (root): lookup, calc, answer.
    const a1 = await ask(c, M1);
    const M2 = [...M1, a1, toolMsg(a1, "60")];
    const a2 = await ask(c, M2);
    const M3 = [...M2, a2, toolMsg(a2, "120")];
    const a3 = await ask(c, M3);
    // Output 1: the last tool result rewritten: a branch after the calc turn.
    const M4 = [...M2, a2, toolMsg(a2, "121")];
    const b1 = await ask(c, M4);
    // Output 2: the calc turn asked again (no retry marker): a branch at its start.
    const b2 = await ask(c, M2);
    // Output 3: a sub-agent with the parent's system and user messages and its own task.
    const sub = { role: "user" as const, content: "A bus carries 48 pupils split evenly over 3 classes on trip 1. How many pupils are in each class?" };
    const M6 = [M1[0]!, M1[1]!, sub];
    const s1 = await ask(c, M6);
    // Output 2 (not the last) continues in place at its end; then the sub-agent goes on.
    const M5 = [...M2, b2, toolMsg(b2, "120")];
    const b2b = await ask(c, M5);
    const M7 = [...M6, s1, toolMsg(s1, "16")];
    const s2 = await ask(c, M7);

    const tag = sessionTag(KEY);
    // Tool-call ids: unique per session and branch (call_{tag}_{output}_{turn}_{i}).
    expect([a1, a2, b2, s1].map((m) => m.tool_calls![0]!.id)).toEqual([`call_${tag}_0_0_0`, `call_${tag}_0_1_0`, `call_${tag}_2_1_0`, `call_${tag}_3_0_0`]);
    expect([a3, b1, b2b, s2].map((m) => m.tool_calls?.length ?? 0)).toEqual([0, 0, 0, 0]);

    const st = await gw.finish(KEY, { by: "agent", reward: 1 });
    const outs = agentOutputs(st, { reward: 1 });
    expect(outs.length).toBe(4);
    const [o0, o1, o2, o3] = outs as [AgentLoopOutput, AgentLoopOutput, AgentLoopOutput, AgentLoopOutput];
    const P = o0.prompt_ids.length;
    const ctx = (o: AgentLoopOutput) => [...o.prompt_ids, ...o.response_ids];
    // The ends of the root's sampled turns (each ends with <|im_end|>, mask 1).
    const ends = o0.response_ids.flatMap((id, i) => (id === IM_END && o0.response_mask[i] === 1 ? [P + i + 1] : []));
    expect(ends.length).toBe(3);
    const obs1 = o0.response_mask.indexOf(0, ends[0]! - P);
    const a2Start = P + o0.response_mask.indexOf(1, obs1);
    const subAt = tok.renderIds(M1 as ChatMessage[], { tools, addGenerationPrompt: false }).length;
    expect(outs.map((o) => [o.parent_output_index, o.branch_at])).toEqual([
      [null, null],
      [0, ends[1]!],
      [0, a2Start],
      [0, subAt],
    ]);
    // The shared prefixes are the parent's tokens; the branches in the response keep the root's prompt and the
    // parent's sampled ids with mask 1 (and their log-probs).
    for (const o of [o1, o2, o3]) expect(ctx(o).slice(0, o.branch_at!)).toEqual(ctx(o0).slice(0, o.branch_at!));
    for (const o of [o1, o2]) {
      expect(o.prompt_ids).toEqual(o0.prompt_ids);
      const n = o.branch_at! - P;
      expect(o.response_mask.slice(0, n)).toEqual(o0.response_mask.slice(0, n));
      expect(o.response_logprobs!.slice(0, n)).toEqual(o0.response_logprobs!.slice(0, n));
    }
    expect(o1.response_mask.slice(0, ends[1]! - P).filter((x) => x === 1).length).toBeGreaterThan(0);
    // Branch 1 after the calc turn: the rewritten result's observation (mask 0), then the answer (mask 1).
    const obs121 = [198, 151644, 872, 198, 151665, 198, ...tok.encode("121"), 198, 151666, IM_END, 198, 151644, 77091, 198];
    const answer = [...tok.encode(script.rules[3].turns[2]), IM_END];
    expect(o1.response_ids.slice(ends[1]! - P)).toEqual([...obs121, ...answer]);
    expect(o1.response_mask.slice(ends[1]! - P) as number[]).toEqual([...obs121.map(() => 0), ...answer.map(() => 1)]);
    // The sub-agent: its prompt is the fresh render of its messages, whose first tokens are the parent's.
    expect(o3.prompt_ids).toEqual(tok.renderIds(M6 as ChatMessage[], { tools, addGenerationPrompt: true }));

    // Each output is the linear trajectory of its path (a fresh session making the same calls).
    const path = async (c: OpenAI, steps: ((prev: Msg[]) => Msg[])[]) => {
      let prev: Msg[] = [];
      let reply: Msg | null = null;
      for (const step of steps) {
        const messages = step(reply ? [...prev, reply] : prev);
        reply = await ask(c, messages);
        prev = messages;
      }
    };
    const lastCall = (m: Msg[]) => m[m.length - 1] as Msg & { tool_calls?: OpenAI.ChatCompletionMessageToolCall[] };
    const r0 = await linear("r0_0_0", (c) => path(c, [() => M1, (p) => [...p, toolMsg(lastCall(p), "60")], (p) => [...p, toolMsg(lastCall(p), "120")]]));
    const r1 = await linear("r1_0_0", (c) => path(c, [() => M1, (p) => [...p, toolMsg(lastCall(p), "60")], (p) => [...p, toolMsg(lastCall(p), "121")]]));
    const r2 = await linear("r2_0_0", (c) => path(c, [() => M1, (p) => [...p, toolMsg(lastCall(p), "60")], (p) => [...p, toolMsg(lastCall(p), "120")]]));
    const r3 = await linear("r3_0_0", (c) => path(c, [() => M6, (p) => [...p, toolMsg(lastCall(p), "16")]]));
    expect([o0, o1, o2, o3].map(tokens)).toEqual([r0, r1, r2, r3].map((r) => tokens(r.out)));
    expect(outs.map((o) => o.extra_fields.tool_calls)).toEqual([2, 2, 2, 1]);

    // Records: parent_key and branch_at, through the queue's codec and back.
    const t: PlannedTrajectory = { key: KEY, uid: "u0", session_id: 0, row_index: 0, row: null, row_error: null, group_size: 1, trajectory_info: { step: 0, sample_index: 0, rollout_n: 0, validate: false } } as unknown as PlannedTrajectory;
    const records = outs.map((o, i) => toTrajectoryRecord(t, "openai_agent", o, config(), i));
    expect(records.map((r) => [r.key, r.parent_key, r.branch_at])).toEqual([
      ["u0_0_0", null, null],
      ["u0_0_1", "u0_0_0", ends[1]!],
      ["u0_0_2", "u0_0_0", a2Start],
      ["u0_0_3", "u0_0_0", subAt],
    ]);
    for (const r of records) {
      const back = decodeRecord(validateAndEncode(r).encoded as unknown as Record<string, string>);
      expect(back).toEqual(r);
      expect(JSON.parse(encodeRecord(r).meta)).toMatchObject({ parent_key: r.parent_key, branch_at: r.branch_at });
      expect(outputOfRecord(back)).toMatchObject({ parent_output_index: r.parent_key === null ? null : Number(r.parent_key!.split("_")[2]), branch_at: r.branch_at });
    }

    // Delivered as a tree (deliver: "tree"): every branch of this real session is cut at its branch_at, and resolves back.
    const nodes = treeNodes(records);
    expect(nodes.map((n) => n.tree_prompt_length ?? null)).toEqual([null, ...records.slice(1).map((r) => r.prompt_ids.length)]);
    expect(nodes.map((n) => n.prompt_ids.length + n.response_ids.length)).toEqual(records.map((r) => r.prompt_ids.length + r.response_ids.length - (r.branch_at ?? 0)));
    expect(nodes[1]!.response_ids).toEqual(records[1]!.response_ids.slice(ends[1]! - records[1]!.prompt_ids.length));
    expect(resolveTree(nodes)).toEqual(records);

    // Stored by reference: a branch's open event holds no shared token or message.
    const stored = (await storage.get(AgentGateway.storageKey(KEY)))!;
    const opens = stored.deltas.map((d) => AgentSessionEvent.parse(JSON.parse(d))).filter((e): e is TurnEvent => e.e === "turn" && e.open !== undefined).map((e) => e.open!);
    expect(opens.map((o) => [o.branch ?? null, o.messages.length])).toEqual([
      [null, 2],
      [{ parent: 0, at: ends[1]!, messages: 5 }, 0],
      [{ parent: 0, at: a2Start, messages: 4 }, 0],
      [{ parent: 0, at: subAt, messages: 2 }, 1],
    ]);
    expect(opens.slice(1, 3).map((o) => o.prompt_ids)).toEqual(["", ""]);
    // The in-place continuation of output 2 (not the last output) names it.
    const turns = stored.deltas.map((d) => JSON.parse(d)).filter((e) => e.e === "turn");
    expect(turns.map((e) => e.output ?? null)).toEqual([null, null, null, null, null, null, 2, null]);

    // A crash: another process folds the stored log and gives identical records.
    const resumed = setup(storage);
    expect(agentOutputs((await resumed.gw.get(KEY))!, { reward: 1 })).toEqual(outs);
    expect(agentOutputs(foldAgentSession(KEY, stored), { reward: 1 })).toEqual(outs);

    // Bytes: the tree's turn events against the same four trajectories stored as separate linear outputs.
    const treeBytes = await turnBytes(storage, KEY);
    const separate = r0.bytes + r1.bytes + r2.bytes + r3.bytes;
    console.log(`tree turn events ${treeBytes} B, the same trajectories as separate outputs ${separate} B`);
    expect(treeBytes).toBeLessThan(separate);
  });

  test("a re-ask of the first turn shares the prompt, other messages make a root, earlier leaves continue in place, and a branch may branch", async () => {
    const KEY = "u1_0_0";
    const { gw, storage, fetchApp } = setup();
    await createSession(gw, KEY);
    const c = sdk(fetchApp, KEY);
    const M1 = rows[3]!.prompt as Msg[];
    const a1 = await ask(c, M1);
    const M2 = [...M1, a1, toolMsg(a1, "60")];
    const a2 = await ask(c, M2);
    // Output 1: the first call again: a sibling sharing the whole prompt.
    const c1 = await ask(c, M1);
    // Output 2: another system message shares nothing: a root.
    await ask(c, [{ role: "system", content: "You are terse." }, M1[1]!]);
    // Output 0, then output 1, continue at their ends (neither is the last output).
    await ask(c, [...M2, a2, toolMsg(a2, "120")]);
    const N2 = [...M1, c1, toolMsg(c1, "sixty")];
    const d1 = await ask(c, N2);
    await ask(c, [...N2, d1, toolMsg(d1, "120")]);
    // Output 3: output 1's last tool result rewritten: a branch of the branch, past its own branch point.
    await ask(c, [...N2, d1, toolMsg(d1, "999")]);
    const st = await gw.finish(KEY, { by: "agent", reward: 1 });
    const outs = agentOutputs(st, { reward: 1 });
    const P = outs[0]!.prompt_ids.length;
    const o1 = outs[1]!;
    // The end of output 1's second sampled turn.
    const ends1 = o1.response_ids.flatMap((id, i) => (id === IM_END && o1.response_mask[i] === 1 ? [P + i + 1] : []));
    expect(outs.map((o) => [o.parent_output_index, o.branch_at])).toEqual([
      [null, null],
      [0, P],
      [null, null],
      [1, ends1[1]!],
    ]);
    expect(outs[1]!.prompt_ids).toEqual(outs[0]!.prompt_ids);
    expect(outs[2]!.prompt_ids).toEqual(tok.renderIds([{ role: "system", content: "You are terse." }, M1[1]! as ChatMessage], { tools, addGenerationPrompt: true }));
    const stored = (await storage.get(AgentGateway.storageKey(KEY)))!;
    expect(stored.deltas.map((d) => JSON.parse(d)).filter((e) => e.e === "turn").map((e) => [e.open?.branch?.parent ?? (e.open ? "root" : null), e.output ?? null])).toEqual([
      ["root", null],
      [null, null],
      [0, null],
      ["root", null],
      [null, 0],
      [null, 1],
      [null, 1],
      [1, null],
    ]);
    expect(agentOutputs(foldAgentSession(KEY, stored), { reward: 1 })).toEqual(outs);
  });

  test("siblings whose samples read alike: a continuation goes to the one whose tool-call ids it echoes (a fresh-user trial saw it go to the latest)", async () => {
    const KEY = "u7_0_0";
    const { gw, fetchApp } = setup();
    await createSession(gw, KEY);
    const c = sdk(fetchApp, KEY);
    const M1 = rows[3]!.prompt as Msg[];
    const a1 = await ask(c, M1);
    const b1 = await ask(c, M1);
    // The simulated engine repeats its sample: the siblings read alike but for their tool-call ids.
    expect(b1.content).toBe(a1.content);
    expect(a1.tool_calls![0]!.id).not.toBe(b1.tool_calls![0]!.id);
    await ask(c, [...M1, a1, toolMsg(a1, "60")]);
    const st = (await gw.get(KEY))!;
    expect(st.outputs.map((o) => o.turns.length)).toEqual([2, 1]);
    // And the other sibling's ids continue the other one.
    await ask(c, [...M1, b1, toolMsg(b1, "60")]);
    expect((await gw.get(KEY))!.outputs.map((o) => o.turns.length)).toEqual([2, 2]);
  });

  test("bad input: a record's branch names an earlier output of its session, both fields or neither; a stored branch must name a real point", async () => {
    const t = { key: "u2_0_0", uid: "u2", session_id: 0, row_index: 0, row: null, row_error: null, group_size: 1, trajectory_info: { step: 0, sample_index: 0, rollout_n: 0, validate: false } } as unknown as PlannedTrajectory;
    const out: AgentLoopOutput = { prompt_ids: [1, 2], response_ids: [3], response_mask: [1], response_logprobs: [-0.5], reward_score: null, num_turns: 2, truncated: false, finish_reason: "stop", metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {} };
    const fieldOf = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return [(e as Error).name, (e as { field?: string }).field];
      }
      return null;
    };
    expect(fieldOf(() => toTrajectoryRecord(t, "x", { ...out, parent_output_index: 1, branch_at: 1 }, config(), 1))).toEqual(["InputError", "parent_output_index"]);
    expect(fieldOf(() => toTrajectoryRecord(t, "x", { ...out, parent_output_index: 0, branch_at: null }, config(), 1))).toEqual(["InputError", "branch_at"]);
    expect(fieldOf(() => toTrajectoryRecord(t, "x", { ...out, parent_output_index: null, branch_at: 2 }, config(), 1))).toEqual(["InputError", "parent_output_index"]);
    expect(toTrajectoryRecord(t, "x", { ...out, parent_output_index: 0, branch_at: 2 }, config(), 1)).toMatchObject({ key: "u2_0_1", parent_key: "u2_0_0", branch_at: 2 });
    // Records of loops that build no trees keep neither key.
    expect(Object.keys(toTrajectoryRecord(t, "x", out, config(), 0))).not.toContain("parent_key");

    // A stored log whose branch names a point its parent does not have is refused when folded.
    const { gw, storage, fetchApp } = setup();
    await createSession(gw, "u2_0_0");
    await ask(sdk(fetchApp, "u2_0_0"), rows[3]!.prompt as Msg[]);
    const stored = (await storage.get(AgentGateway.storageKey("u2_0_0")))!;
    const first = JSON.parse(stored.deltas[1]!) as TurnEvent;
    const forged = { ...first, open: { ...first.open!, prompt_ids: "", messages: [], branch: { parent: 0, at: 9999, messages: 2 } } };
    const bad = (at: number, parent = 0) => foldAgentSession("u2_0_0", { ...stored, deltas: [...stored.deltas, JSON.stringify({ ...forged, open: { ...forged.open, branch: { parent, at, messages: 2 } } })] });
    expect(fieldOf(() => bad(9999))).toEqual(["StoreError", undefined]);
    expect(() => bad(9999)).toThrow("output 1 branches from output 0 at token 9999: not the start or end of one of its sampled turns");
    expect(() => bad(10, 5)).toThrow("no such output");
  });

  test("routed experts: a branch holds the parent's experts up to branch_at and its own calls' after, as the linear path; the fold is bit-exact", async () => {
    const KEY = "u3_0_0";
    const { gw, fetchApp, engine } = setup();
    await createSession(gw, KEY, config({ return_routed_experts: true }));
    const c = sdk(fetchApp, KEY);
    const M1 = rows[3]!.prompt as Msg[];
    const a1 = await ask(c, M1);
    await ask(c, [...M1, a1, toolMsg(a1, "60")]);
    const b = await ask(c, [...M1, a1, toolMsg(a1, "sixty")]);
    await ask(c, [...M1, a1, toolMsg(a1, "sixty"), b, toolMsg(b, "120")]);
    const outs = agentOutputs((await gw.finish(KEY, { by: "agent", reward: 1 }))!, { reward: 1 });
    expect(outs.map((o) => o.parent_output_index)).toEqual([null, 0]);
    const per = outs[1]!.routed_experts_shape![0] * outs[1]!.routed_experts_shape![1];
    for (const o of outs) {
      const stream = [...o.prompt_ids, ...o.response_ids];
      // Every position but the last sampled one holds the experts of its context (the sim's are a function of it).
      expect(o.routed_experts).toEqual([...engine.routedExperts(stream, stream.length - 1), ...new Array(per).fill(0)]);
    }
    expect(outs[1]!.routed_experts!.slice(0, outs[1]!.branch_at! * per)).toEqual(outs[0]!.routed_experts!.slice(0, outs[1]!.branch_at! * per));
    gw.forget(KEY);
    expect(agentOutputs((await gw.get(KEY))!, { reward: 1 })).toEqual(outs);
  });
});
