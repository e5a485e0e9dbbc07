import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import * as errors from "../../shared/errors.ts";
import { createEngineClient } from "../../shared/inference/index.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import type { SimFault } from "../../infra/sim-engine/index.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { SimEngineVersion } from "../../infra/sim-engine/wire.ts";
import { loadReplyFixtures, loadRequestFixture, type EngineFixture } from "./replay-server.ts";

/**
 * The simulated engine against the same recorded replies the adapters are
 * tested with: for each fixture the simulator is driven into the same case
 * (stop, length, abort, overflow, 5xx) with the adapter's exact request body,
 * and its reply must have the recorded reply's shape (every recorded field,
 * same JSON type; no extra top-level fields), the same status, and the adapter
 * must reach the same outcome on it.
 */

interface Case {
  fault?: SimFault;
  /** Overrides of the request body (max tokens). */
  maxTokens?: number;
  /** Replica whose max_model_len is 10 (shorter than the 13-token prompt). */
  tiny?: boolean;
  /** The vLLM version the simulator plays (default main). */
  version?: SimEngineVersion;
}

const CASES: Record<string, Case> = {
  "vllm-completion-token-ids": {},
  "vllm-completion-length": { maxTokens: 3 },
  "vllm-completion-abort-partial": { fault: { kind: "abort_after", tokens: 1 } },
  "vllm-completion-abort-empty": { fault: { kind: "abort_after", tokens: 0 } },
  "vllm-generate-tokens": { version: "0.2x" },
  "vllm-generate-tokens-main": {},
  "vllm-error-context-overflow": { version: "0.2x", maxTokens: 50_000 },
  "vllm-error-context-overflow-current": { tiny: true, maxTokens: 1 },
  "vllm-error-max-tokens-over-model-len": { maxTokens: 50_000 },
  "vllm-error-500-engine-dead": { fault: { kind: "http_500" } },
  "vllm-error-503": { fault: { kind: "http_503" } },
  "sglang-generate-stop": {},
  "sglang-generate-length": { maxTokens: 3 },
  "sglang-generate-abort-partial": { fault: { kind: "abort_after", tokens: 1 } },
  "sglang-generate-abort-empty": { fault: { kind: "abort_after", tokens: 0 } },
  "sglang-error-context-overflow-input": { tiny: true, maxTokens: 1 },
  "sglang-error-context-overflow-requested": { maxTokens: 50_000 },
  "sglang-error-500-detail": { fault: { kind: "http_500" } },
  "sglang-error-503-detail": { fault: { kind: "http_503" } },
};

/** Where `actual` lacks a field of `recorded` or has another JSON type. null in the recording matches anything. */
function shapeDiff(recorded: unknown, actual: unknown, path = "$"): string[] {
  if (recorded === null) return [];
  const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
  if (kind(recorded) !== kind(actual)) return [`${path}: recorded ${kind(recorded)}, sim ${kind(actual)}`];
  if (Array.isArray(recorded)) {
    const a = actual as unknown[];
    return recorded.length > 0 && a.length > 0 ? shapeDiff(recorded[0], a[0], `${path}[]`) : [];
  }
  if (recorded && typeof recorded === "object") {
    // top_logprobs entries are dicts keyed by token string: only their values are shaped.
    if (path.endsWith(".logprobs.top_logprobs[]")) {
      return Object.values(actual as object).every((v) => typeof v === "number") ? [] : [`${path}: values are not numbers`];
    }
    const out: string[] = [];
    for (const [k, v] of Object.entries(recorded)) {
      if (!(k in (actual as object))) out.push(`${path}.${k}: missing in sim reply`);
      else out.push(...shapeDiff(v, (actual as Record<string, unknown>)[k], `${path}.${k}`));
    }
    return out;
  }
  return [];
}

const reqFixture = loadRequestFixture();
const fixtures = new Map(loadReplyFixtures().map((f) => [f.name, f]));
let sim: RunningSimEngine;
let tiny: RunningSimEngine;
let old: RunningSimEngine;

beforeAll(async () => {
  sim = await startSimEngine({ replicas: 1 });
  tiny = await startSimEngine({ replicas: 1, maxModelLen: 10 });
  old = await startSimEngine({ replicas: 1, wire: { engineVersion: "0.2x" } });
});
afterAll(async () => {
  await sim.stop();
  await tiny.stop();
  await old.stop();
});

function bodyFor(f: EngineFixture, c: Case): Record<string, unknown> {
  const body = structuredClone(reqFixture[f.engine].body);
  if (c.maxTokens !== undefined) {
    if (f.engine === "vllm") body.max_tokens = c.maxTokens;
    else if (f.engine === "vllm-generate") (body.sampling_params as Record<string, unknown>).max_tokens = c.maxTokens;
    else (body.sampling_params as Record<string, unknown>).max_new_tokens = c.maxTokens;
  }
  return body;
}

describe("sim engine replies have the recorded replies' shape", () => {
  test("every case names an existing fixture", () => {
    for (const name of Object.keys(CASES)) expect(fixtures.has(name)).toBe(true);
  });

  for (const [name, c] of Object.entries(CASES)) {
    test(name, async () => {
      const f = fixtures.get(name)!;
      const replica = (c.tiny ? tiny : c.version === "0.2x" ? old : sim).replicas[0];
      replica.engine.setFault(c.fault ?? null);
      const res = await fetch(replica.url + reqFixture[f.engine].path, {
        method: "POST",
        headers: reqFixture.headers,
        body: JSON.stringify(bodyFor(f, c)),
      });
      const body = await res.json();
      expect(res.status).toBe(f.reply.status);
      expect(shapeDiff(f.reply.body, body)).toEqual([]);
      expect(Object.keys(body as object).filter((k) => !(k in (f.reply.body as object)))).toEqual([]);

      // The adapter reaches the same outcome on the sim's reply as on the recording.
      replica.engine.setFault(c.fault ?? null);
      const i = reqFixture.input;
      const client = createEngineClient({ url: replica.url, format: f.engine, model: "Qwen/Qwen3-8B" });
      const run = client.generate({ ...i, sampling_params: SamplingParams.parse(i.sampling_params), max_tokens: c.maxTokens ?? i.max_tokens });
      if (f.expect.output) {
        const out = await run;
        expect(out.finish_reason).toBe(f.expect.output.finish_reason as never);
        expect(out.log_probs?.length).toBe(out.token_ids.length);
      } else {
        const e = await run.catch((x) => x);
        expect(e).toBeInstanceOf((errors as Record<string, unknown>)[f.expect.error!] as typeof Error);
      }
      replica.engine.setFault(null);
    });
  }
});
