import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import type { AgentLoopContext } from "../../shared/agent-loop/agent-loop.ts";
import { EngineUnavailableError } from "../../shared/errors.ts";
import { RetryingClient } from "../../shared/inference/retrying-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { VllmClient } from "../../shared/inference/vllm-client.ts";
import { RolloutConfig, type AgentLoopOutput, type TokenOutput } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { SimFault } from "../../infra/sim-engine/script.ts";

const QUESTION = "What is the capital of France?";
const SCRIPT = { seed: 3, rules: [{ when: "capital of France", turns: ["<think>\nEasy.\n</think>\n\nThe capital of France is Paris."] }] };
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

/** Records every request and reply passing through. */
function recording(inner: InferenceClient) {
  const calls: { req: GenerateRequest; out?: TokenOutput; error?: string }[] = [];
  const client: InferenceClient = {
    async generate(req) {
      const entry: (typeof calls)[number] = { req: { ...req, prompt_ids: Array.from(req.prompt_ids) } };
      calls.push(entry);
      try {
        entry.out = await inner.generate(req);
        return entry.out;
      } catch (e) {
        entry.error = (e as Error).name;
        throw e;
      }
    },
  };
  return { client, calls };
}

async function runSingleTurn(fault?: SimFault): Promise<{ out: AgentLoopOutput; calls: ReturnType<typeof recording>["calls"] }> {
  const engine = new SimEngine({ tokenizer: tok, script: { ...SCRIPT, ...(fault ? { fault } : {}) } });
  const { client, calls } = recording(new SimEngineClient(engine));
  const config = RolloutConfig.parse({ prompt_length: 256, response_length: 64, max_model_len: 4096 });
  const ctx: AgentLoopContext = { tokenizer: tok, client, config, maxModelLen: 4096, reward: false };
  const out = (await defaultAgentLoopRegistry().create("single_turn_agent", ctx).run(
    { temperature: 1, top_p: 1, top_k: -1, logprobs: true },
    { uid: "u", session_id: 0, prompt: [{ role: "user", content: QUESTION }] },
  )) as AgentLoopOutput;
  return { out, calls };
}

describe("preemption: an abort keeps its partial tokens and resumes the turn (C11)", () => {
  test("abort after 3 tokens: resumed with prompt ‖ partial and max_tokens − 3; same tokens as an uninterrupted turn; num_preempted 1", async () => {
    const clean = await runSingleTurn();
    const cut = await runSingleTurn({ kind: "abort_after", tokens: 3, times: 1 });
    expect(clean.calls.length).toBe(1);
    expect(cut.calls.length).toBe(2);
    const [first, second] = cut.calls;
    expect(first!.out!.finish_reason).toBe("abort");
    expect(first!.out!.token_ids.length).toBe(3);
    expect(first!.req.max_tokens).toBe(64);
    expect(second!.req.prompt_ids).toEqual([...Array.from(first!.req.prompt_ids), ...first!.out!.token_ids]);
    expect(second!.req.max_tokens).toBe(64 - 3);
    expect(second!.req.request_id).not.toBe(first!.req.request_id);
    expect(second!.req.routing_key).toBe(first!.req.routing_key);

    expect(cut.out.response_ids).toEqual(clean.out.response_ids);
    expect(cut.out.response_mask).toEqual(clean.out.response_mask);
    expect(cut.out.finish_reason).toBe("stop");
    expect(tok.decode(cut.out.response_ids, { skipSpecialTokens: true })).toContain("The capital of France is Paris.");
    // The partial tokens keep the log-probs they were sampled with; the rest are the resumed call's.
    expect(cut.out.response_logprobs).toEqual([...first!.out!.log_probs!, ...second!.out!.log_probs!].map(Math.fround));
    expect(cut.out.metrics.num_preempted).toBe(1);
    expect(clean.out.metrics.num_preempted).toBe(-1);
  });

  test("an abort before any token (EngineAbortedError) is resent as it was; two aborts count 2", async () => {
    const clean = await runSingleTurn();
    const cut = await runSingleTurn({ kind: "abort_after", tokens: 0, times: 2 });
    expect(cut.calls.map((c) => c.error ?? c.out!.finish_reason)).toEqual(["EngineAbortedError", "EngineAbortedError", "stop"]);
    expect(cut.calls[2]!.req.prompt_ids).toEqual(cut.calls[0]!.req.prompt_ids);
    expect(cut.calls[2]!.req.max_tokens).toBe(64);
    expect(cut.out.response_ids).toEqual(clean.out.response_ids);
    expect(cut.out.response_logprobs).toEqual(clean.out.response_logprobs);
    expect(cut.out.metrics.num_preempted).toBe(2);
  });

  test("a turn aborted on every attempt ends `abort` after 8 resumes with the tokens it has", async () => {
    const cut = await runSingleTurn({ kind: "abort_after", tokens: 1 });
    expect(cut.calls.length).toBe(9);
    expect(cut.out.finish_reason).toBe("abort");
    expect(cut.out.response_ids.length).toBe(9);
    expect(cut.out.response_ids).toEqual(cut.calls.flatMap((c) => c.out!.token_ids));
    expect(cut.out.metrics.num_preempted).toBe(8);
  });
});

describe("engine errors and hangs: client retries with backoff and deadlines", () => {
  let sim: RunningSimEngine;
  beforeAll(async () => {
    sim = await startSimEngine({ script: SCRIPT, tokenizer: tok });
  });
  afterAll(() => sim.stop());
  const req = (id: string): GenerateRequest => ({
    request_id: id,
    routing_key: "k_0_0",
    prompt_ids: tok.encode("capital of France"),
    sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true },
    max_tokens: 32,
  });

  test("503, 503, then a reply: three attempts with fresh request ids", async () => {
    const engine = sim.replicas[0]!.engine;
    engine.setFault({ kind: "http_503", times: 2 });
    const client = new RetryingClient(new VllmClient({ url: sim.urls[0]! }), { retries: 3, minDelayMs: 5 });
    const before = engine.requests.length;
    const out = await client.generate(req("r-503"));
    expect(out.finish_reason).toBe("stop");
    expect(engine.requests.slice(before).map((r) => r.request_id)).toEqual(["r-503", "r-503-r1", "r-503-r2"]);
    engine.setFault(null);
  });

  test("a hang past the attempt deadline is retried; a hang past the overall deadline is EngineUnavailableError", async () => {
    const engine = sim.replicas[0]!.engine;
    engine.setFault({ kind: "hang", times: 1 });
    const client = new RetryingClient(new VllmClient({ url: sim.urls[0]!, timeoutMs: 200 }), { retries: 2, minDelayMs: 5 });
    expect((await client.generate(req("r-hang"))).finish_reason).toBe("stop");

    engine.setFault({ kind: "hang" });
    const bounded = new RetryingClient(new VllmClient({ url: sim.urls[0]!, timeoutMs: 10_000 }), { retries: 5, minDelayMs: 5, deadlineMs: 300 });
    const err = await bounded.generate(req("r-dead")).catch((e) => e);
    expect(err).toBeInstanceOf(EngineUnavailableError);
    expect(err.message).toBe("engine call r-dead got no reply within its 300 ms deadline");
    engine.setFault(null);
  });

  test("a 500 that outlasts the retries propagates (the trajectory fails with the reason)", async () => {
    const engine = sim.replicas[0]!.engine;
    engine.setFault({ kind: "http_500" });
    const client = new RetryingClient(new VllmClient({ url: sim.urls[0]! }), { retries: 1, minDelayMs: 5 });
    const err = await client.generate(req("r-500")).catch((e) => e);
    expect(err).toBeInstanceOf(EngineUnavailableError);
    expect(err.message).toStartWith(`engine at ${sim.urls[0]}/v1/completions answered HTTP 500`);
    engine.setFault(null);
  });
});
