/**
 * Trajectory-tree benchmark (issue 30 item 5, "bytes stored for a tree vs
 * the same branches as separate outputs"): per row of
 * examples/gsm8k-tool.jsonl (60 rows, the zero-latency simulated engine on
 * examples/policy.json), an agent runs the conversation to its end (the
 * root), then k branches, each the root's last tool call answered with
 * another text and run to its end. Stored in one agent session they are a
 * tree: each branch's open event names its parent and `branch_at`, the
 * shared tokens are not stored again. The same k + 1 trajectories stored as
 * separate outputs are k + 1 linear sessions making the same calls (every
 * one stores its whole path). Bytes are the UTF-8 bytes of the stored turn
 * events (the session input and `open` event, stored once per session in
 * either layout, counted apart in "with input"); the records built from
 * both are checked equal token for token first.
 *
 *   bun bench/tree.ts [--k 1,2,4,8] [--rows 60]
 */
import { readFileSync } from "node:fs";
import { AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../shared/agent-gateway/agent-session.ts";
import type { ChatReply } from "../shared/agent-gateway/openai-wire.ts";
import { RolloutConfig, type ChatMessage, type ToolSchema } from "../shared/schema/index.ts";
import { MemorySessionStorage } from "../shared/session/session-storage.ts";
import { defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../infra/sim-engine/sim-engine-client.ts";
import { calcToolContent } from "../infra/tools/calc.ts";
import { lookupFact } from "../infra/tools/lookup.ts";
import { toTrajectoryRecord, type PlannedTrajectory } from "../shared/rollout/batch.ts";
import { resolveTree, treeNodes } from "../shared/store/tree-delivery.ts";
import { arg, printTable } from "./util.ts";

const KS = arg("--k", "1,2,4,8").split(",").map(Number);
const ROWS = Number(arg("--rows", "60"));

const ROOT = new URL("../", import.meta.url).pathname;
const tok = await defaultTokenizer();
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows: { prompt: ChatMessage[] }[] = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .split("\n")
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l));
const tools: ToolSchema[] = parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: 1 } }).tools.map((t) => t.schema);
const config = RolloutConfig.parse({ prompt_length: 1024, response_length: 1024, max_model_len: 4096 });
const SP = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
const TOKEN = "tok_0123456789abcdef0123";
const T0 = Date.now();
const enc = new TextEncoder();

function toolContent(name: string, args: Record<string, unknown>): string {
  if (name === "calc") return calcToolContent(args);
  if (name === "lookup") return lookupFact(typeof args.query === "string" ? args.query : String(args.query));
  return `Error: unknown tool '${name}'`;
}

function gateway() {
  const storage = new MemorySessionStorage();
  const gw = new AgentGateway({ storage, tokenizer: tok, client: new SimEngineClient(new SimEngine({ tokenizer: tok, script })), maxModelLen: 4096, wallClockMs: () => T0 });
  return { gw, storage };
}

async function create(gw: AgentGateway, key: string, row: number) {
  const [uid] = key.split("_");
  await gw.create({ v: 1, key, uid: uid!, session_id: 0, token: TOKEN, created_ms: T0, deadline_ms: T0 + 3_600_000, sampling_params: SP, rollout: config, tools, messages: rows[row]!.prompt });
}

/** The messages after a reply: the assistant message, then one tool message per call (`rewrite` replaces their texts). */
function after(messages: ChatMessage[], reply: ChatReply, rewrite?: string): ChatMessage[] | null {
  const calls = reply.message.tool_calls ?? [];
  if (!calls.length) return null;
  const results = calls.map((c) => ({ role: "tool" as const, tool_call_id: c.id, content: rewrite ?? toolContent(c.function.name, JSON.parse(c.function.arguments)) }));
  return [...messages, reply.message as ChatMessage, ...results];
}

/** Runs calls from `messages` until the model stops calling tools; returns every request sent. */
async function converse(gw: AgentGateway, key: string, messages: ChatMessage[]): Promise<ChatMessage[][]> {
  const sent: ChatMessage[][] = [];
  for (let m: ChatMessage[] | null = messages; m; ) {
    sent.push(m);
    const reply = await gw.chat(key, TOKEN, { model: "qwen3", messages: m, tools });
    m = after(m, reply);
  }
  return sent;
}

/** Bytes of a session's stored turn events, and of everything it stores (input included). */
async function bytes(storage: MemorySessionStorage, key: string): Promise<{ turns: number; all: number }> {
  const s = (await storage.get(AgentGateway.storageKey(key)))!;
  const turns = s.deltas.filter((d) => JSON.parse(d).e === "turn").reduce((n, d) => n + enc.encode(d).length, 0);
  return { turns, all: s.deltas.reduce((n, d) => n + enc.encode(d).length, 0) + enc.encode(s.input ?? "").length };
}

const tokensOf = (o: { prompt_ids: number[]; response_ids: number[]; response_mask: number[] }) => JSON.stringify([o.prompt_ids, o.response_ids, o.response_mask]);

/** Tokens (prompt ‖ response) a reader receives for a session's records, read as leaves (whole) and with deliver: "tree". */
function deliveredTokens(key: string, outs: ReturnType<typeof agentOutputs>): { leaves: number; tree: number } {
  const t = { key, uid: key.split("_")[0]!, session_id: 0, row_index: 0, row: null, row_error: null, group_size: 1, trajectory_info: { step: 0, sample_index: 0, rollout_n: 0, validate: false } } as unknown as PlannedTrajectory;
  const records = outs.map((o, i) => toTrajectoryRecord(t, "openai_agent", o, config, i));
  const nodes = treeNodes(records);
  if (JSON.stringify(resolveTree(nodes)) !== JSON.stringify(records)) throw new Error(`${key}: the tree nodes do not resolve to the records`);
  const n = (rs: typeof records) => rs.reduce((a, r) => a + r.prompt_ids.length + r.response_ids.length, 0);
  return { leaves: n(records), tree: n(nodes) };
}

const delivered = [["k branches", "leaves: tokens / row", "deliver tree: tokens / row", "tree / leaves"]];
const table = [["k branches", "tree turn bytes / row", "separate turn bytes / row", "tree / separate", "with input: tree", "with input: separate", "tree / separate"]];
for (const k of KS) {
  let tree = { turns: 0, all: 0 };
  let separate = { turns: 0, all: 0 };
  let counted = 0;
  const dl = { leaves: 0, tree: 0 };
  for (let row = 0; row < Math.min(ROWS, rows.length); row++) {
    const t = gateway();
    const key = `t${row}_0_0`;
    await create(t.gw, key, row);
    const rootCalls = await converse(t.gw, key, rows[row]!.prompt);
    if (rootCalls.length < 2) continue; // no tool call: nothing to rewrite
    const last = rootCalls[rootCalls.length - 1]!;
    const paths: ChatMessage[][][] = [rootCalls];
    for (let b = 1; b <= k; b++) {
      // The last tool result answered differently: the branch starts after the last tool-calling turn.
      const rewritten = last.map((m, i) => (i >= last.length - 1 && m.role === "tool" ? { ...m, content: `${m.content} (take ${b})` } : m));
      paths.push([...rootCalls.slice(0, -1), ...(await converse(t.gw, key, rewritten))]);
    }
    const treeOuts = agentOutputs((await t.gw.finish(key, { by: "agent", reward: null }))!, { reward: null });
    const sepOuts = [];
    for (const [p, calls] of paths.entries()) {
      const s = gateway();
      const skey = `s${row}-${p}_0_0`;
      await create(s.gw, skey, row);
      for (const m of calls) await s.gw.chat(skey, TOKEN, { model: "qwen3", messages: m, tools });
      sepOuts.push(...agentOutputs((await s.gw.finish(skey, { by: "agent", reward: null }))!, { reward: null }));
      const b = await bytes(s.storage, skey);
      separate = { turns: separate.turns + b.turns, all: separate.all + b.all };
    }
    if (treeOuts.map(tokensOf).join() !== sepOuts.map(tokensOf).join()) throw new Error(`row ${row}: the tree's records differ from the linear sessions'`);
    const d = deliveredTokens(key, treeOuts);
    dl.leaves += d.leaves;
    dl.tree += d.tree;
    const b = await bytes(t.storage, key);
    tree = { turns: tree.turns + b.turns, all: tree.all + b.all };
    counted++;
  }
  table.push([
    String(k),
    (tree.turns / counted).toFixed(0),
    (separate.turns / counted).toFixed(0),
    (tree.turns / separate.turns).toFixed(2),
    (tree.all / counted).toFixed(0),
    (separate.all / counted).toFixed(0),
    (tree.all / separate.all).toFixed(2),
  ]);
  delivered.push([String(k), (dl.leaves / counted).toFixed(0), (dl.tree / counted).toFixed(0), (dl.tree / dl.leaves).toFixed(2)]);
}
printTable(`Bytes stored per row: a tree of the root and k branches vs the same k + 1 trajectories as separate outputs (${ROWS} rows)`, table);
printTable(`Tokens delivered per row to a reader: the same records read as leaves vs with deliver: "tree" (${ROWS} rows)`, delivered);
