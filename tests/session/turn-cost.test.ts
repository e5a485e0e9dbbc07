import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { DurableObjectSessionStorage } from "../../infra/cloudflare/do-session-storage.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import { DeltaTracker, foldCheckpoint } from "../../shared/session/checkpoint-delta.ts";
import { CHECKPOINT_VERSION, saveToolAgentFields } from "../../shared/session/checkpoint.ts";
import type { ToolAgentData } from "../../shared/agent-loop/tool-agent.ts";
import fc from "fast-check";
import type { RedisArg, RedisCommander } from "../../shared/store/redis-commander.ts";
import { fakeDurableObjectStorage } from "../helpers/durable-object.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { depsFor, inputFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 32 item 3: a turn's store traffic is the turn's own work, not its history. A 128-turn
// tool_agent session runs over each session store; the commands and bytes written between
// engine call k and k+1 (turn k's checkpoint) are counted — counts, not timings — and turn 127's
// must equal turn 4's in commands and stay within a few bytes of it (the step and part numbers
// gain digits; nothing else may grow). Before checkpoint version 3, every delta held the whole
// per-turn lists (model_versions, …): turn 127 sent 1,247 bytes more than turn 4.
const redis = await requireRedis();
const prefix = randomPrefix("turn-cost");
const TURNS = 128;
const PROMPT = "Add one, 127 times, with the calculator.";
const TOOL_TURN = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>';
const ANSWER = "Done.\n#### 2";
let tools: ToolServer;
let commander: IoRedisCommander;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
  commander = new IoRedisCommander(REDIS_URL);
});
afterAll(async () => {
  await tools.stop();
  await commander.close();
  await deleteByPrefix(prefix);
});

/** Store traffic so far: commands (or storage operations) and bytes sent. */
interface Traffic {
  ops: number;
  bytes: number;
}

const utf8 = new TextEncoder();
const argBytes = (a: RedisArg) => (typeof a === "string" ? utf8.encode(a).byteLength : a.byteLength);

/** A RedisCommander that counts every command it forwards (pipelines count each command) and its argument bytes. */
function countingCommander(inner: RedisCommander, t: Traffic): RedisCommander {
  const count = (cmd: RedisArg[]) => {
    t.ops++;
    for (const a of cmd) t.bytes += argBytes(a);
  };
  return {
    exec: (cmd) => (count(cmd), inner.exec(cmd)),
    pipeline: (cmds) => (cmds.forEach(count), inner.pipeline(cmds)),
    close: () => inner.close(),
    maxRequestBytes: inner.maxRequestBytes,
  };
}

/** A SessionStorage that counts appends and the bytes of their deltas (the store-agnostic view). */
function countingStorage(inner: SessionStorage, t: Traffic): SessionStorage {
  return {
    get: (k) => inner.get(k),
    delete: (k) => inner.delete(k),
    append: (k, step, delta, o) => {
      t.ops++;
      for (const d of delta) t.bytes += utf8.encode(d).byteLength;
      return inner.append(k, step, delta, o);
    },
  };
}

/** Wraps the engine client so each generate call snapshots the traffic counter: snapshot k is the traffic before call k+1. */
function snapshotting(client: InferenceClient, t: Traffic, snaps: Traffic[]): InferenceClient {
  return new Proxy(client, {
    get(target, prop, recv) {
      if (prop === "generate") return (req: Parameters<InferenceClient["generate"]>[0]) => (snaps.push({ ...t }), target.generate(req));
      return Reflect.get(target, prop, recv);
    },
  });
}

async function runLongSession(name: string, makeStorage: (t: Traffic) => SessionStorage): Promise<{ perTurn: Traffic[]; numTurns: number }> {
  const { deps, tok } = await depsFor(tools.url);
  const engine = new SimEngine({ tokenizer: tok, maxModelLen: 32768, script: { seed: 5, rules: [{ when: PROMPT, turns: [...Array(TURNS - 1).fill(TOOL_TURN), ANSWER] }], default: ["x"] } });
  const traffic: Traffic = { ops: 0, bytes: 0 };
  const snaps: Traffic[] = [];
  deps.client = snapshotting(new SimEngineClient(engine), traffic, snaps);
  deps.maxModelLen = 32768;
  const rollout = rolloutConfig({ prompt_length: 1024, response_length: 24000, max_model_len: 32768, multi_turn: { max_assistant_turns: 200, max_parallel_calls: 1 } as never });
  const uid = `cost${name}`;
  const base = inputFor(0, 0, rollout, uid);
  const input = { ...base, kwargs: { ...base.kwargs, prompt: [{ role: "user", content: PROMPT }], reward_model: { style: "rule", ground_truth: "2" } } };
  const storage = makeStorage(traffic);
  const s = (await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps) }, input))!;
  const r = await s.run();
  if (r.status !== "finished") throw new Error(JSON.stringify(r).slice(0, 500));
  snaps.push({ ...traffic });
  const out = r.outputs[0]!;
  expect(engine.stats.requests).toBe(TURNS);
  expect(out.reward_score).toBe(1);
  // Turn k's traffic: what was sent between engine call k and call k+1 (the last: up to the end, which adds the final commit).
  const perTurn: Traffic[] = [];
  for (let k = 1; k < snaps.length; k++) perTurn.push({ ops: snaps[k]!.ops - snaps[k - 1]!.ops, bytes: snaps[k]!.bytes - snaps[k - 1]!.bytes });
  return { perTurn, numTurns: out.num_turns };
}

describe("a turn's store traffic does not grow with the session's history", () => {
  const stores: [string, (t: Traffic) => SessionStorage][] = [
    ["memory", (t) => countingStorage(new MemorySessionStorage(), t)],
    ["durable object", (t) => countingStorage(new DurableObjectSessionStorage(fakeDurableObjectStorage()), t)],
    ["redis (commands on the wire)", (t) => new RedisSessionStorage(countingCommander(commander, t), { prefix })],
  ];
  for (const [name, make] of stores) {
    test.skipIf(name.startsWith("redis") && !redis)(`${name}: turn 127 sends the commands of turn 4 and at most a few bytes more`, async () => {
      const { perTurn } = await runLongSession(name.split(" ")[0]!, make);
      // perTurn[k-1] is the traffic after engine call k: 127 tool turns, then the final answer's.
      expect(perTurn.length).toBe(TURNS);
      const t4 = perTurn[3]!;
      expect(t4.ops).toBeGreaterThan(0);
      // Every tool turn from the 4th on sends exactly turn 4's number of commands…
      for (let k = 4; k < TURNS; k++) expect([k, perTurn[k - 1]!.ops]).toEqual([k, t4.ops]);
      // …and its bytes differ only by numbers gaining digits (step 10 → 100, part p:9 → p:99) and the seconds of its metrics:
      // ≤ 64 bytes in all. One per-turn item written whole again (a list of model versions: ≥ 2 bytes a turn) passes it by 124 turns.
      for (let k = 4; k < TURNS; k++) expect([k, perTurn[k - 1]!.bytes - t4.bytes <= 64]).toEqual([k, true]);
    }, HANG_MS);
  }
});

describe("per-turn lists as deltas (checkpoint version 3)", () => {
  type Lists = { toolRewards: number[]; toolMetrics: { turn: number; name: string; metrics: Record<string, unknown> }[]; turnScores: number[]; modelVersions: unknown[]; tokenVersions: [number, unknown][] };
  /** The small fields saveToolAgentFields reads, around `lists` (no messages, no builder). */
  const data = (l: Lists) =>
    ({
      assistantTurns: 0, userTurns: 0, pending: [], lastAssistantText: "", metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
      droppedToolCalls: 0, toolCalls: 0, toolErrors: 0, finishReason: "stop", terminatedBy: "model", messages: [], builder: null, ...l,
    }) as unknown as ToolAgentData;
  const head = (step: number, loop: unknown, v = CHECKPOINT_VERSION) => JSON.stringify({ v, key: "k", step, phase: "running", agent_name: "tool_agent", loop_state: "generating", loop, error: null, deadline_ms: null, updated_ms: 0 });
  const op = fc.oneof(
    fc.record({ kind: fc.constant("push" as const), list: fc.constantFrom("toolRewards", "turnScores", "modelVersions", "toolMetrics", "tokenVersions"), x: fc.integer({ min: -3, max: 3 }) }),
    fc.record({ kind: fc.constant("set" as const), list: fc.constantFrom("toolRewards", "modelVersions", "toolMetrics", "tokenVersions"), x: fc.integer({ min: 0, max: 9 }) }),
    fc.record({ kind: fc.constant("cut" as const), list: fc.constantFrom("toolRewards", "turnScores", "modelVersions", "toolMetrics", "tokenVersions"), x: fc.integer({ min: 0, max: 3 }) }),
  );
  const apply = (l: Lists, o: { kind: "push" | "set" | "cut"; list: keyof Lists; x: number }) => {
    const arr = l[o.list] as unknown[];
    const item = o.list === "toolMetrics" ? { turn: o.x, name: "calc", metrics: { m: o.x } } : o.list === "tokenVersions" ? [o.x + 3, `v${o.x}`] : o.list === "modelVersions" ? (o.x % 2 ? `v${o.x}` : o.x) : o.x;
    if (o.kind === "push") arr.push(item);
    // In place: an object item's contents change under the same reference (the committed copy must see it).
    else if (o.kind === "set" && arr.length) {
      const at = o.x % arr.length;
      const cur = arr[at];
      if (cur !== null && typeof cur === "object" && !Array.isArray(cur)) (cur as { metrics: Record<string, unknown> }).metrics.m = `changed${o.x}`;
      else if (Array.isArray(cur)) cur[1] = `w${o.x}`;
      else arr[at] = o.x + 100;
    } else if (o.kind === "cut") arr.length = Math.max(0, arr.length - o.x);
  };

  test("folding the deltas of any sequence of appends, in-place changes and cuts gives the lists as they are; a version-2 head folds with them", () => {
    fc.assert(
      fc.property(fc.array(fc.array(op, { maxLength: 4 }), { minLength: 1, maxLength: 12 }), fc.boolean(), (turns, v2Head) => {
        const lists: Lists = { toolRewards: [1], toolMetrics: [], turnScores: [], modelVersions: ["v0"], tokenVersions: [[0, "v0"]] };
        const tracker = new DeltaTracker();
        const deltas: string[] = [];
        // A session written by the version before (whole lists, no lists_from), resumed by this one.
        if (v2Head) {
          const { lists_from: _f, ...whole } = { ...saveToolAgentFields(data(lists)), lists_from: null, messages_from: 0, messages: [], builder: null };
          deltas.push(head(0, whole, 2));
          tracker.accept(data(structuredClone(lists)));
        }
        for (const ops of turns) {
          for (const o of ops) apply(lists, o as never);
          const d = data(lists);
          deltas.push(head(deltas.length, tracker.delta(d)));
          tracker.accept(d);
        }
        const { loop } = foldCheckpoint(deltas, "k");
        const f = loop!.fields;
        expect([f.tool_rewards, f.turn_scores, f.model_versions, f.token_versions ?? [], f.tool_metrics ?? []]).toEqual([lists.toolRewards, lists.turnScores, lists.modelVersions, lists.tokenVersions, lists.toolMetrics]);
      }),
      { numRuns: 300 },
    );
  });

  test("a delta that keeps more items than the state before it holds is refused as a damaged log", () => {
    const d0 = head(0, { ...saveToolAgentFields(data({ toolRewards: [], toolMetrics: [], turnScores: [], modelVersions: ["v0"], tokenVersions: [] })), lists_from: {}, messages_from: 0, messages: [], builder: null });
    const d1 = head(1, { ...saveToolAgentFields(data({ toolRewards: [], toolMetrics: [], turnScores: [], modelVersions: [], tokenVersions: [] })), lists_from: { model_versions: 2 }, messages_from: 0, messages: [], builder: null });
    expect(() => foldCheckpoint([d0, d1], "k")).toThrow("session 'k': stored checkpoint keeps 2 items of loop.model_versions, but the state before it holds 1");
  });
});
