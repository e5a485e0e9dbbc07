import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { faultRateDecision, FaultRateInjector, parseSimScript, requestHash, SimEngine, SimEngineFault, SimFaultRate } from "../../infra/sim-engine/index.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";

const EOS = 151645;
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});
const user = (text: string) => tok.encode(`<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`);
const gen = (engine: SimEngine, key: string, prompt: number[]) =>
  engine.generate({ request_id: crypto.randomUUID(), routing_key: key, prompt_ids: prompt, max_tokens: 64 }).then(
    (r) => ({ ok: true as const, r }),
    (e: unknown) => ({ ok: false as const, e: e as SimEngineFault }),
  );

describe("probabilistic fault injection (fault_rate)", () => {
  test("faultRateDecision: deterministic, about the rates, abort tokens within [0, max]", () => {
    const spec = SimFaultRate.parse({ errors: 0.05, aborts: 0.05, max_abort_tokens: 4 });
    const counts = { http_500: 0, http_503: 0, abort_after: 0 };
    for (let i = 0; i < 20_000; i++) {
      const d = faultRateDecision(spec, 7, requestHash(`k${i}`, [1, 2, 3]), 0);
      if (!d) continue;
      counts[d.kind]++;
      if (d.kind === "abort_after") expect(d.tokens >= 0 && d.tokens <= 4).toBe(true);
      expect(faultRateDecision(spec, 7, requestHash(`k${i}`, [1, 2, 3]), 0)).toEqual(d);
    }
    expect(counts.http_500 + counts.http_503).toBeGreaterThan(800);
    expect(counts.http_500 + counts.http_503).toBeLessThan(1200);
    expect(counts.http_500).toBeGreaterThan(300);
    expect(counts.http_503).toBeGreaterThan(300);
    expect(counts.abort_after).toBeGreaterThan(800);
    expect(counts.abort_after).toBeLessThan(1200);
    expect(requestHash("a", [1, 2])).not.toBe(requestHash("b", [1, 2]));
    expect(requestHash("a", [1, 2])).not.toBe(requestHash("a", [1, 2, 0]));
  });

  test("bad rates are ConfigErrors naming the field", () => {
    expect(() => new FaultRateInjector({ errors: 2 }, 1)).toThrow(ConfigError);
    expect(() => new FaultRateInjector({ errors: 0.6, aborts: 0.6 }, 1)).toThrow("fault_rate.aborts");
    expect(() => parseSimScript({ fault_rate: { errors: -1 } })).toThrow("script.fault_rate.errors");
  });

  test("errors: the drawn status, logged by routing key; a retry is the next attempt", async () => {
    const engine = new SimEngine({ tokenizer: tok, script: { seed: 3, default: ["hello there"] }, faultRate: { errors: 1 } });
    const first = await gen(engine, "k1_0_0", user("hi"));
    expect(first.ok).toBe(false);
    const kind = faultRateDecision(SimFaultRate.parse({ errors: 1 }), 3, requestHash("k1_0_0", user("hi")), 0)!.kind;
    expect((first as { e: SimEngineFault }).e.kind).toBe(kind as "http_500" | "http_503");
    await gen(engine, "k1_0_0", user("hi"));
    expect(engine.faultRate!.injected.map((f) => [f.kind, f.routing_key, f.attempt, f.turn_index])).toEqual([
      [kind, "k1_0_0", 0, 0],
      [faultRateDecision(SimFaultRate.parse({ errors: 1 }), 3, requestHash("k1_0_0", user("hi")), 1)!.kind, "k1_0_0", 1, 0],
    ]);
    expect(engine.requests.map((r) => r.fault)).toEqual(engine.faultRate!.injected.map((f) => f.kind));
  });

  test("aborts cut the turn at k tokens (logged); an abort past the turn's end is no fault; the script's fault_rate works too", async () => {
    const engine = new SimEngine({ tokenizer: tok, script: { seed: 3, default: ["one two three four five six seven"], fault_rate: { aborts: 1, max_abort_tokens: 3 } } });
    const full = [...tok.encode("one two three four five six seven"), EOS];
    const r = await gen(engine, "a_0_0", user("go"));
    const k = (faultRateDecision(SimFaultRate.parse({ aborts: 1, max_abort_tokens: 3 }), 3, requestHash("a_0_0", user("go")), 0) as { tokens: number }).tokens;
    expect(r.ok && r.r.finish_reason).toBe("abort");
    expect(r.ok && r.r.token_ids).toEqual(full.slice(0, k));
    expect(engine.faultRate!.injected).toEqual([{ kind: "abort", routing_key: "a_0_0", request_id: engine.requests[0]!.request_id, attempt: 0, turn_index: 0, tokens: k }]);
    expect(engine.faultRate!.counts).toEqual({ requests: 1, http_500: 0, http_503: 0, abort: 1 });

    // "x" is 2 tokens (x, <|im_end|>): a drawn abort after k ≥ 2 tokens comes too late and is not a fault.
    const spec = SimFaultRate.parse({ aborts: 1, max_abort_tokens: 5 });
    let key = "";
    for (let i = 0; !key; i++) if ((faultRateDecision(spec, 3, requestHash(`c${i}_0_0`, user("go")), 0) as { tokens: number }).tokens >= 2) key = `c${i}_0_0`;
    const late = new SimEngine({ tokenizer: tok, script: { seed: 3, default: ["x"] }, faultRate: { aborts: 1, max_abort_tokens: 5 } });
    const l = await gen(late, key, user("go"));
    expect(l.ok && l.r.finish_reason).toBe("stop");
    expect(l.ok && l.r.token_ids).toEqual([...tok.encode("x"), EOS]);
    expect(late.faultRate!.injected).toEqual([]);
    expect(late.faultRate!.counts).toEqual({ requests: 1, http_500: 0, http_503: 0, abort: 0 });
    expect(late.requests[0]!.fault).toBeUndefined();
  });

  describe("startSimEngine: one injector over all replicas", () => {
    let sim: RunningSimEngine;
    beforeAll(async () => {
      sim = await startSimEngine({ replicas: 2, script: { seed: 5, default: ["ok"] }, faultRate: { errors: 0.5 } });
    });
    afterAll(() => sim.stop());

    test("attempts are counted across replicas; HTTP errors carry the engine's shape", async () => {
      expect(sim.replicas[0]!.engine.faultRate).toBe(sim.replicas[1]!.engine.faultRate!);
      const body = JSON.stringify({ prompt: user("hey"), max_tokens: 8 });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) {
        const res = await fetch(`${sim.urls[i % 2]}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-session-id": "s_0_0" }, body });
        statuses.push(res.status);
        await res.arrayBuffer();
      }
      const spec = SimFaultRate.parse({ errors: 0.5 });
      const expected = statuses.map((_, a) => {
        const d = faultRateDecision(spec, 5, requestHash("s_0_0", user("hey")), a);
        return d ? (d.kind === "http_500" ? 500 : 503) : 200;
      });
      expect(statuses).toEqual(expected);
      expect(sim.replicas[0]!.engine.faultRate!.injected.map((f) => f.attempt)).toEqual(expected.flatMap((s, a) => (s === 200 ? [] : [a])));
    });
  });
});
