import { describe, expect, test } from "bun:test";
import { AgentLoop } from "../../shared/agent-loop/agent-loop.ts";
import { AgentLoopRegistry, loopOutputs, runAgentLoop } from "../../shared/agent-loop/registry.ts";
import { InputError } from "../../shared/errors.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, ctxOf, ScriptedClient, SP } from "./helpers.ts";

// A custom loop's return value is checked for shape before anything reads it: a bad output is an
// error naming the loop and output index (not a TypeError from deep inside the batch).
const GOOD = {
  prompt_ids: [1, 2],
  response_ids: [3, 4],
  response_mask: [1, 1] as (0 | 1)[],
  response_logprobs: [-0.5, -0.25],
  num_turns: 2,
  metrics: { generate_sequences: 0.1, tool_calls: 0, compute_score: 0, num_preempted: -1 },
};

describe("loopOutputs", () => {
  test("a single output or a list; defaults applied; typed arrays accepted as they are", () => {
    const [o] = loopOutputs("x", GOOD);
    expect(o).toEqual({ ...GOOD, reward_score: null, truncated: false, finish_reason: "stop", extra_fields: {} });
    const ids = new Int32Array([3, 4]);
    expect(loopOutputs("x", [GOOD, { ...GOOD, response_ids: ids }])[1]!.response_ids).toBe(ids as never);
    expect(loopOutputs("x", [])).toEqual([]);
  });

  test("bad values name the loop, the output index and the field", () => {
    const cases: [unknown, string][] = [
      [null, "agent_loop 'x' output[0]: expected an AgentLoopOutput object, got null"],
      [{ foo: 1 }, "agent_loop 'x' output[0].prompt_ids: expected an array of token ids, got undefined"],
      [[GOOD, { bogus: true }], "agent_loop 'x' output[1].prompt_ids: expected an array of token ids, got undefined"],
      [{ ...GOOD, response_mask: "11" }, "agent_loop 'x' output[0].response_mask: expected an array of token mask values, got string"],
      [{ ...GOOD, response_logprobs: 5 }, "agent_loop 'x' output[0].response_logprobs: expected an array or null, got number"],
      [{ ...GOOD, num_turns: "2" }, "agent_loop 'x' output[0].num_turns: Invalid input: expected number, received string"],
    ];
    for (const [out, message] of cases) {
      const err = (() => {
        try {
          loopOutputs("x", out);
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(InputError);
      expect((err as Error).message).toBe(message);
    }
  });

  test("through a batch: the session fails with that reason; the other rows' sessions are unaffected", async () => {
    class Bad extends AgentLoop {
      async run(): Promise<never> {
        return [GOOD, null] as never;
      }
    }
    const tok = await defaultTokenizer();
    const registry = new AgentLoopRegistry().register("bad_agent", Bad).register("good_agent", class extends AgentLoop {
      async run() {
        return GOOD as never;
      }
    });
    const rollout = config({ n: 1 });
    const req = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "a" }], uid: "lo0", agent_name: "bad_agent" }, { prompt: [{ role: "user", content: "b" }], uid: "lo1", agent_name: "good_agent" }] });
    const plan = planBatch(req, rollout);
    const ctx = ctxOf(tok, new ScriptedClient(tok, []), rollout);
    const run = new BatchRun(plan, {
      store: new MemoryTransferQueue(),
      rollout,
      concurrency: 2,
      executor: {
        agentNameFor: (t) => t.row!.agent_name!,
        run: async (t) => ({ agentName: t.row!.agent_name!, outputs: await runAgentLoop(registry, ctx, SP, { ...t.row!, uid: t.uid, session_id: t.session_id }) }),
      },
    });
    await run.run();
    const byKey = new Map(run.records().map((r) => [r.key, r]));
    expect(byKey.get("lo0_0_0")!.error).toBe("agent_loop 'bad_agent' output[1]: expected an AgentLoopOutput object, got null");
    expect(byKey.get("lo1_0_0")!.error).toBeNull();
    expect(byKey.get("lo1_0_0")!.response_ids).toEqual([3, 4]);
  });
});
