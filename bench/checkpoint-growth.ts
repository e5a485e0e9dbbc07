/**
 * Checkpoint cost as a trajectory grows: one `tool_agent` session of ~200
 * turns × ~1,000 tokens (a calc tool call each turn, sim engine, loopback
 * tools), on memory and Redis session storage. Reports the median time of a
 * commit (the session's whole `commit`: encode + storage write) at 1k, 32k
 * and 200k tokens of trajectory so far, the 200k/1k ratio, and the bytes
 * written to storage for the whole trajectory.
 *
 * Run against this tree:  ./node_modules/.bin/bun bench/checkpoint-growth.ts
 * Against another tree (read-only, e.g. main): EDGELOOP_ROOT=/work/main ./node_modules/.bin/bun bench/checkpoint-growth.ts
 * Needs Redis (REDIS_URL, default redis://127.0.0.1:6379).
 */
import { join } from "node:path";

const ROOT = process.env.EDGELOOP_ROOT ?? join(import.meta.dir, "..");
const TURNS = Number(process.env.TURNS ?? 200);
const imp = (p: string) => import(join(ROOT, p));

const { TrajectorySession } = await imp("shared/session/trajectory-session.ts");
const { MemorySessionStorage } = await imp("shared/session/session-storage.ts");
const { RedisSessionStorage } = await imp("shared/session/redis-session-storage.ts");
const { IoRedisCommander } = await imp("infra/redis/ioredis-commander.ts");
const { SimEngine } = await imp("infra/sim-engine/sim-engine.ts");
const { SimEngineClient } = await imp("infra/sim-engine/sim-engine-client.ts");
const { startToolServer } = await imp("infra/tools/server.ts");
const { defaultAgentLoopRegistry } = await imp("shared/agent-loop/index.ts");
const { sessionLoopFactory } = await imp("shared/rollout/executor.ts");
const { RolloutConfig } = await imp("shared/schema/index.ts");
const { defaultTokenizer } = await imp("shared/tokens/tokenizer.ts");
const { parseToolsFile } = await imp("shared/tools/tools-file.ts");
const { WebhookToolClient } = await imp("shared/tools/webhook-tool-client.ts");
const { readFileSync } = await import("node:fs");

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
};

// Every commit is timed at the session's own `commit` (private; patched here for the bench only).
const samples: { tokens: number; us: number }[] = [];
const proto = TrajectorySession.prototype as { commit: (...a: unknown[]) => Promise<void> };
const commit = proto.commit;
proto.commit = async function (this: { data?: { builder?: { responseLength: number } } }, ...a: unknown[]) {
  const tokens = this.data?.builder?.responseLength ?? 0;
  const t = performance.now();
  await commit.apply(this, a);
  samples.push({ tokens, us: (performance.now() - t) * 1000 });
};

/** Counts the characters of every string handed to a storage write (put/append and friends). */
function counting<T extends object>(inner: T): { storage: T; bytes: () => number; largest: () => number } {
  let n = 0;
  let largest = 0;
  const storage = new Proxy(inner, {
    get(t, p, r) {
      const v = Reflect.get(t, p, r);
      if (typeof v !== "function" || p === "get" || p === "delete") return typeof v === "function" ? v.bind(t) : v;
      return (...args: unknown[]) => {
        const walk = (x: unknown): void => {
          if (typeof x === "string") n += x.length;
          else if (Array.isArray(x)) x.forEach(walk);
          else if (x && typeof x === "object") Object.values(x).forEach(walk);
        };
        const before = n;
        args.slice(1).forEach(walk);
        largest = Math.max(largest, n - before);
        return v.apply(t, args);
      };
    },
  });
  return { storage, bytes: () => n, largest: () => largest };
}

const tok = await defaultTokenizer();
const filler = " a".repeat(980);
const engine = new SimEngine({
  tokenizer: tok,
  maxModelLen: 262144,
  script: { seed: 1, rules: [], default: [`${filler}\n<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>`] },
});
const tools = startToolServer({ port: 0 });
const toolsFile = parseToolsFile(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8"), { source: "tools", vars: { port: Number(new URL(tools.url).port) } });
const deps = {
  registry: defaultAgentLoopRegistry(),
  tokenizer: tok,
  client: new SimEngineClient(engine),
  maxModelLen: 262144,
  tools: new WebhookToolClient(toolsFile.tools),
  reward: {},
};
const rollout = RolloutConfig.parse({ prompt_length: 512, response_length: 250000, max_model_len: 262144, multi_turn: { max_assistant_turns: TURNS } });
const commander = new IoRedisCommander(REDIS_URL);
const prefix = `bench-cpgrowth:${Date.now()}:`;
const out: string[] = [];
try {
  for (const [name, inner] of [
    ["memory", new MemorySessionStorage()],
    ["redis", new RedisSessionStorage(commander, { prefix })],
  ] as const) {
    samples.length = 0;
    const { storage, bytes, largest } = counting(inner);
    const key = `cpg-${name}_0_0`;
    const input = {
      key,
      agent_name: "tool_agent",
      sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true, seed: 1 },
      kwargs: { uid: "cpg", session_id: 0, global_steps: 0, key, data_source: "bench", prompt: [{ role: "user", content: "Add numbers with the calc tool." }], reward_model: { style: "rule", ground_truth: "2" } },
      rollout,
      model_version: "v1",
    };
    const s = await TrajectorySession.open(key, { storage, createLoop: sessionLoopFactory(deps) }, input);
    const t0 = performance.now();
    const r = await s.run();
    if (process.env.DEBUG) console.log(JSON.stringify(r, (k, v) => (k === "prompt_ids" ? undefined : v)).slice(0, 1500));
    const total = (performance.now() - t0) / 1000;
    const at = (lo: number, hi: number) => median(samples.filter((x) => x.tokens >= lo && x.tokens <= hi).map((x) => x.us));
    const c1 = at(500, 2000);
    const c32 = at(30000, 34000);
    const c200 = at(190000, 210000);
    const maxTokens = Math.max(...samples.map((x) => x.tokens));
    out.push(
      `${name}: status ${r.status}, ${samples.length} commits, ${maxTokens} tokens, run ${total.toFixed(1)} s`,
      `  commit µs (median) at 1k ${c1.toFixed(0)} | 32k ${c32.toFixed(0)} | 200k ${c200.toFixed(0)} | ratio 200k/1k ${(c200 / c1).toFixed(2)}`,
      `  bytes written for the trajectory: ${bytes()} (${(bytes() / 1e6).toFixed(1)} MB); largest single write ${largest()} (the finishing commit's outputs, or a full snapshot)`,
    );
  }
} finally {
  const keys = await commander.exec(["KEYS", `${prefix}*`]);
  if (Array.isArray(keys) && keys.length) await commander.exec(["DEL", ...keys]);
  await commander.close();
  tools.stop?.();
}
console.log(`tree: ${ROOT}\n${out.join("\n")}`);
process.exit(0);
