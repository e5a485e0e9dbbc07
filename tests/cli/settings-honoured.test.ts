import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { unregisterToolCallParser } from "../../shared/tools/parser-registry.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { RolloutRequest } from "../../shared/rollout/batch.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Settings that used to be accepted and ignored (issue 18 item 10): each is now honoured, or refused.
const rows = readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l));

let sim: RunningSimEngine;
let proxy: ReturnType<typeof Bun.serve>;
/** Every body POSTed to the engine's /v1/completions, as the engine received it. */
const bodies: Record<string, unknown>[] = [];
let runtime: Runtime;

beforeAll(async () => {
  sim = await startSimEngine({ replicas: 1, script: JSON.parse(readFileSync(join(import.meta.dir, "..", "..", "examples", "policy.json"), "utf8")) });
  // A real engine URL in front of the simulator that records what each request asked for.
  proxy = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const url = new URL(req.url);
      const body = req.method === "POST" ? await req.text() : undefined;
      if (url.pathname === "/v1/completions" && body) bodies.push(JSON.parse(body));
      return fetch(`${sim.urls[0]}${url.pathname}${url.search}`, { method: req.method, headers: req.headers, ...(body === undefined ? {} : { body }) });
    },
  });
  runtime = await buildRuntime({ engine: `http://127.0.0.1:${proxy.port}` });
});
afterAll(async () => {
  await runtime.close();
  proxy.stop(true);
  await sim.stop();
});

async function records(req: Partial<RolloutRequest> & { rows: unknown[] }): Promise<TrajectoryRecord[]> {
  const { run } = await runtime.service.accept({ global_steps: -1, model_version: null, validate: false, ...req });
  const out: TrajectoryRecord[] = [];
  for await (const r of run.stream()) out.push(r);
  return out;
}

describe("rollout.val_kwargs.do_sample", () => {
  test("false (verl's default): a validation batch is greedy whatever val_kwargs' temperature, top_p and top_k say", async () => {
    bodies.length = 0;
    const recs = await records({ rows: rows.slice(0, 2), validate: true, config: { rollout: { val_kwargs: { temperature: 0.7, top_p: 0.9, top_k: 20, do_sample: false } } } });
    expect(recs.map((r) => r.error)).toEqual([null, null]);
    expect(bodies.length).toBeGreaterThanOrEqual(2);
    expect(new Set(bodies.map((b) => JSON.stringify([b.temperature, b.top_p, b.top_k])))).toEqual(new Set(["[0,1,0]"]));
  }, HANG_MS);

  test("true: a validation batch samples with val_kwargs' values", async () => {
    bodies.length = 0;
    await records({ rows: rows.slice(0, 2), validate: true, config: { rollout: { val_kwargs: { temperature: 0.7, top_p: 0.9, top_k: 20, do_sample: true } } } });
    expect(new Set(bodies.map((b) => JSON.stringify([b.temperature, b.top_p, b.top_k])))).toEqual(new Set(["[0.7,0.9,20]"]));
  }, HANG_MS);

  test("training batches are untouched by val_kwargs", async () => {
    bodies.length = 0;
    await records({ rows: rows.slice(0, 1), config: { rollout: { temperature: 0.6, val_kwargs: { temperature: 0.7, do_sample: false } } } });
    expect(new Set(bodies.map((b) => b.temperature))).toEqual(new Set([0.6]));
  }, HANG_MS);
});

describe("rollout.multi_turn.enable", () => {
  test("false: tool_agent's first assistant turn is final; its tool calls are not run", async () => {
    bodies.length = 0;
    const recs = await records({ rows: rows.slice(0, 3), config: { rollout: { multi_turn: { enable: false } } } });
    expect(recs.map((r) => [r.num_turns, r.extra_fields.terminated_by, r.extra_fields.tool_calls, r.metrics.tool_calls])).toEqual([
      [2, "multi_turn_disabled", 0, 0],
      [2, "multi_turn_disabled", 0, 0],
      [2, "multi_turn_disabled", 0, 0],
    ]);
    // One engine call per trajectory, and the response is exactly the sampled turn (no observation).
    expect(bodies.length).toBe(3);
    for (const r of recs) expect(r.response_mask.every((m) => m === 1)).toBe(true);
  }, HANG_MS);

  test("true (default): the same rows call their tools", async () => {
    const recs = await records({ rows: rows.slice(0, 3) });
    for (const r of recs) expect(r.extra_fields.tool_calls as number).toBeGreaterThan(0);
  }, HANG_MS);
});

describe("a batch's own rollout.agent.agent_loop_config_path", () => {
  test("is refused with a 400 naming it (loops are loaded once, at start), and nothing is run", async () => {
    const app = createRolloutsApp({ service: runtime.service });
    const res = await app.request("/v1/rollouts", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rows: rows.slice(0, 1), config: { rollout: { agent: { agent_loop_config_path: "/nonexistent/loops.json" } } } }),
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      error: {
        code: "invalid_config",
        field: "rollout.agent.agent_loop_config_path",
        message:
          "config rollout.agent.agent_loop_config_path: custom agent loops are loaded once at start from the server's config (none configured); a batch cannot load others: leave the key out and name a loaded loop in agent_name or default_agent_loop",
      },
    });
  });
});

describe("a tool-call parser registered by a loop module", () => {
  test("rollout.multi_turn.format may name it: the format is checked after agent_loop_config_path's modules load, and tool_agent parses with it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-parser-"));
    const repo = join(import.meta.dir, "..", "..");
    try {
      // The module registers a parser (Hermes underneath, counting its calls) and exports a loop.
      writeFileSync(
        join(dir, "counting-parser.ts"),
        [
          `import { registerToolCallParser } from ${JSON.stringify(join(repo, "shared/tools/parser-registry.ts"))};`,
          `import { HermesToolCallParser } from ${JSON.stringify(join(repo, "shared/tools/hermes-parser.ts"))};`,
          `export { ToolAgentLoop as CountingToolAgent } from ${JSON.stringify(join(repo, "shared/agent-loop/tool-agent.ts"))};`,
          `export const seen = { turns: 0 };`,
          `registerToolCallParser("counting_hermes", () => { const h = new HermesToolCallParser(); return { extract: (t: string) => { seen.turns++; return h.extract(t); } } as never; });`,
        ].join("\n"),
      );
      writeFileSync(join(dir, "loops.yaml"), "- name: counting_agent\n  module: ./counting-parser.ts\n  export: CountingToolAgent\n");
      writeFileSync(join(dir, "config.yaml"), "rollout:\n  multi_turn: {format: counting_hermes}\n  agent: {agent_loop_config_path: loops.yaml, default_agent_loop: tool_agent}\n");
      const rt = await buildRuntime({ config: join(dir, "config.yaml") });
      try {
        expect(rt.warnings.filter((w) => w.includes("parser"))).toEqual([]);
        const { run } = await rt.service.accept({ rows: rows.slice(0, 1), global_steps: -1, model_version: null, validate: false });
        const recs: TrajectoryRecord[] = [];
        for await (const r of run.stream()) recs.push(r);
        const { seen } = await import(join(dir, "counting-parser.ts"));
        expect([recs[0]!.error, (recs[0]!.extra_fields.tool_calls as number) > 0]).toEqual([null, true]);
        // The first example row: one calc call, then the answer — two assistant turns, both parsed by it.
        expect([recs[0]!.num_turns, recs[0]!.extra_fields.tool_calls, seen.turns]).toEqual([4, 1, 2]);
      } finally {
        await rt.close();
      }
    } finally {
      unregisterToolCallParser("counting_hermes");
      rmSync(dir, { recursive: true, force: true });
    }
  }, HANG_MS);
});

describe("verl rows that carry only raw_prompt", () => {
  test("run with raw_prompt as their messages (same prompt_ids as the same row with prompt); neither is still a row error", async () => {
    const { prompt, ...rest } = rows[0] as { prompt: unknown };
    const { run, keys } = await runtime.service.accept({ rows: [rows[0], { ...rest, raw_prompt: prompt }, rest], config: { rollout: { n: 1 } }, global_steps: -1, model_version: null, validate: false });
    const byKey = new Map<string, TrajectoryRecord>();
    for await (const r of run.stream()) byKey.set(r.key, r);
    const [withPrompt, withRaw, neither] = keys.map((k) => byKey.get(k)!);
    expect(withRaw!.error).toBe(null);
    expect(withRaw!.prompt_ids).toEqual(withPrompt!.prompt_ids);
    expect(neither!.error).toBe("rows[2].prompt: Invalid input: expected array, received undefined");
  }, HANG_MS);
});

describe("reward.timeout_ms, reward.max_retries and engine.max_retries", () => {
  test("reward.max_retries and timeout_ms are the webhook reward's (were fixed at 2 and 30 s)", async () => {
    let calls = 0;
    // Fails the first three calls of each trajectory's reward, then scores 0.25.
    const reward = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => (++calls % 4 === 0 ? Response.json({ score: 0.25 }) : new Response("busy", { status: 503 })) });
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-reward-"));
    const row = { ...rows[0], agent_name: "single_turn_agent", reward_model: { style: "webhook" } };
    try {
      const run = async (maxRetries: number) => {
        calls = 0;
        writeFileSync(join(dir, "c.json"), JSON.stringify({ reward: { url: `http://127.0.0.1:${reward.port}/r`, timeout_ms: 2000, max_retries: maxRetries }, engine: { max_retries: 0 } }));
        const rt = await buildRuntime({ config: join(dir, "c.json") });
        try {
          const { run } = await rt.service.accept({ rows: [row], global_steps: -1, model_version: null, validate: false });
          const out: TrajectoryRecord[] = [];
          for await (const r of run.stream()) out.push(r);
          return { calls, score: out[0]!.reward_score, error: out[0]!.extra_fields.reward_error ?? null, timeout: (rt.config.reward.timeout_ms) };
        } finally {
          await rt.close();
        }
      };
      expect(await run(3)).toEqual({ calls: 4, score: 0.25, error: null, timeout: 2000 });
      const two = await run(2);
      expect([two.calls, two.score]).toEqual([3, null]);
      expect(two.error).toBe(`webhook http://127.0.0.1:${reward.port}/r: HTTP 503`);
    } finally {
      reward.stop(true);
      rmSync(dir, { recursive: true, force: true });
    }
  }, HANG_MS);
});

test("engine.max_retries is the engine client's retry count (was fixed at 3)", async () => {
  let attempts = 0;
  const down = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: (req) => (new URL(req.url).pathname === "/v1/completions" ? (attempts++, new Response("down", { status: 500 })) : new Response("no", { status: 404 })) });
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-engine-"));
  try {
    const count = async (maxRetries: number) => {
      attempts = 0;
      writeFileSync(join(dir, "c.json"), JSON.stringify({ engine: { url: `http://127.0.0.1:${down.port}`, max_retries: maxRetries }, rollout: { max_model_len: 4096 } }));
      const rt = await buildRuntime({ config: join(dir, "c.json") });
      try {
        const { run } = await rt.service.accept({ rows: [{ ...rows[0], agent_name: "single_turn_agent" }], global_steps: -1, model_version: null, validate: false });
        for await (const r of run.stream()) expect(r.error).not.toBe(null);
        return attempts;
      } finally {
        await rt.close();
      }
    };
    expect([await count(0), await count(2)]).toEqual([1, 3]);
  } finally {
    down.stop(true);
    rmSync(dir, { recursive: true, force: true });
  }
}, HANG_MS);
