import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { GenerateRequest } from "../../shared/inference/types.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { EventLoopShare, SimEngine, SimEngineClient } from "../../infra/sim-engine/index.ts";

/**
 * S21: the in-process simulated engine answers without I/O, so a big batch
 * used to run to its end in microtasks and starve the HTTP server. Lag is
 * counted in engine calls completed between two ticks of a timer (a
 * `setTimeout(0)` chain), not in wall-clock time.
 */

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const CALLS = 3000;

function batch(client: SimEngineClient, prompt: number[]): { done: () => number; all: Promise<unknown> } {
  let done = 0;
  const sp = SamplingParams.parse({});
  const calls = Array.from({ length: CALLS }, (_, i) => {
    const req: GenerateRequest = { request_id: `r${i}`, routing_key: `k_${i}_0`, prompt_ids: prompt, sampling_params: sp, max_tokens: 64 };
    return client.generate(req).then(() => done++);
  });
  return { done: () => done, all: Promise.all(calls) };
}

/** Runs a batch while a timer chain ticks; returns the most calls completed between two ticks and the ticks seen. */
async function lagOf(share: EventLoopShare): Promise<{ maxPerTick: number; ticks: number }> {
  const client = new SimEngineClient(new SimEngine({ tokenizer: tok }), share);
  const prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
  let stop = false;
  let ticks = 0;
  let maxPerTick = 0;
  let last = 0;
  const b = batch(client, prompt);
  const tick = () => {
    const d = b.done();
    maxPerTick = Math.max(maxPerTick, d - last);
    last = d;
    ticks++;
    if (!stop) setImmediate(tick);
  };
  setImmediate(tick);
  await b.all;
  stop = true;
  maxPerTick = Math.max(maxPerTick, b.done() - last);
  return { maxPerTick, ticks };
}

describe("the in-process sim yields to the event loop (S21)", () => {
  test("a large batch: at most a few turns' worth of calls complete between two timer ticks", async () => {
    const share = new EventLoopShare(16);
    const { maxPerTick, ticks } = await lagOf(share);
    // One release of 16 per macrotask turn; a timer tick may land after two or three releases.
    expect(maxPerTick).toBeLessThanOrEqual(4 * 16);
    expect(ticks).toBeGreaterThanOrEqual(CALLS / (4 * 16));
    expect(share.turns).toBeGreaterThanOrEqual(CALLS / 16 - 1);
  });

  test("without a share (every call let through) the whole batch completes between two ticks: what the share prevents", async () => {
    const { maxPerTick } = await lagOf(new EventLoopShare(1_000_000));
    expect(maxPerTick).toBe(CALLS);
  });

  describe("an HTTP server in the same process answers while the batch runs", () => {
    let server: ReturnType<typeof Bun.serve>;
    beforeAll(() => {
      server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("ok") });
    });
    afterAll(() => server.stop(true));

    test("/health answers before the batch ends", async () => {
      const client = new SimEngineClient(new SimEngine({ tokenizer: tok }));
      const b = batch(client, tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"));
      const health = await fetch(`http://127.0.0.1:${server.port}/health`);
      const doneAtAnswer = b.done();
      expect(await health.text()).toBe("ok");
      await b.all;
      expect(doneAtAnswer).toBeLessThan(CALLS);
      expect(b.done()).toBe(CALLS);
    });
  });

  test("the share lets calls through in arrival order, perTurn per macrotask turn", async () => {
    const share = new EventLoopShare(2);
    const order: number[] = [];
    const waits = Array.from({ length: 5 }, (_, i) => Promise.resolve(share.pass()).then(() => order.push(i)));
    await Promise.resolve();
    expect(order).toEqual([0, 1]);
    await Promise.all(waits);
    expect(order).toEqual([0, 1, 2, 3, 4]);
    expect(share.turns).toBe(2);
    expect(() => new EventLoopShare(0)).toThrow("perTurn must be an integer >= 1, got 0");
  });
});
