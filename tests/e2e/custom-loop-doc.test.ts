import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Miniflare } from "miniflare";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { awaitGroups, startServices, startWorkerd, workerBindings, type Services, type Workerd } from "../runtimes/harness.ts";

// Issue 18 item 1: every code block of docs/custom-agent-loop.md, run verbatim with its documented
// `edgeloop/...` imports — (a) from a directory outside the repository where edgeloop is installed as a
// dependency (node_modules/edgeloop → this package: the `exports` map), (b) from inside the repository
// (package self-reference), (c) the Worker entry bundled by wrangler and run in workerd.
// (tests/e2e/loop-outside-repo.test.ts runs the §2 loop through the CLI's own resolver.)
const ROOT = join(import.meta.dir, "..", "..");
const DOC = readFileSync(join(ROOT, "docs", "custom-agent-loop.md"), "utf8");
const blocks = [...DOC.matchAll(/```(\w+)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1]!, code: m[2]! }));
const redis = await requireRedis();

test("the doc's code blocks are the five this file runs (a new block must be added here)", () => {
  expect(blocks.map((b) => b.lang)).toEqual(["ts", "ts", "yaml", "ts", "ts"]);
  // §1's contract is a sketch of the real class: its signatures are the source's.
  const src = readFileSync(join(ROOT, "shared", "agent-loop", "agent-loop.ts"), "utf8");
  expect(blocks[0]!.code).toContain("constructor(ctx: AgentLoopContext);");
  expect(src).toContain("constructor(protected readonly ctx: AgentLoopContext) {}");
  const run = "run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput | AgentLoopOutput[]>;";
  expect(blocks[0]!.code).toContain(run);
  expect(src).toContain(`abstract ${run}`);
});

const [, LOOP, YAML, IN_CODE, WORKER] = blocks.map((b) => b.code);

/**
 * What the doc leaves to the reader in §3's block — `ctx`, `samplingParams`, `row`, `uid` — for the
 * simulated engine with a two-turn script; inserted after the block's imports.
 */
const PREAMBLE = `
import { defaultTokenizer } from "edgeloop/agent-loop";
import { SimEngine, SimEngineClient } from "edgeloop/sim-engine";
import { RolloutConfig, SamplingParams } from "edgeloop/schema";
const tokenizer = await defaultTokenizer();
const script = { seed: 1, rules: [{ when: "What is 2+2?", turns: ["It is 5.\\n#### 5", "Checked: 2+2=4.\\n#### 4"] }] };
const ctx = { tokenizer, client: new SimEngineClient(new SimEngine({ tokenizer, script })), config: RolloutConfig.parse({}), reward: {} };
const samplingParams = SamplingParams.parse({});
const row = { prompt: [{ role: "user", content: "What is 2+2?" }], agent_name: "self_check_agent", data_source: "doc", reward_model: { style: "rule", ground_truth: "4" } };
const uid = "doc-uid";
`;
const EPILOGUE = `
console.log(JSON.stringify(outputs.map((o) => ({ num_turns: o.num_turns, reward_score: o.reward_score, text: tokenizer.decode(o.response_ids), mask: o.response_mask }))));
`;

/** §3's block made a program: its imports, the preamble, its statements, a line printing the outputs. */
function program(): string {
  const lines = IN_CODE!.split("\n");
  const imports = lines.filter((l) => l.startsWith("import "));
  const rest = lines.filter((l) => !l.startsWith("import "));
  return [...imports, PREAMBLE, ...rest, EPILOGUE].join("\n");
}

/** Writes the loop (§2), the YAML (§3) and the program into `dir`, runs `bun program.ts` there. */
async function runIn(dir: string): Promise<{ code: number; stdout: string; stderr: string }> {
  writeFileSync(join(dir, "self-check-loop.ts"), LOOP!);
  writeFileSync(join(dir, "agent-loops.yaml"), YAML!);
  writeFileSync(join(dir, "program.ts"), program());
  const p = Bun.spawn([process.execPath, "program.ts"], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

const EXPECTED = [
  {
    num_turns: 4,
    reward_score: 1,
    text: "It is 5.\n#### 5<|im_end|>\n<|im_start|>user\nCheck your answer. Reply with the final number after ####.<|im_end|>\n<|im_start|>assistant\nChecked: 2+2=4.\n#### 4<|im_end|>",
  },
];

describe("§3 in your own program (Bun), the loop of §2 registered by the YAML", () => {
  const outside = mkdtempSync(join(tmpdir(), "edgeloop-doc-"));
  const inside = join(ROOT, `.doc-test-${crypto.randomUUID().slice(0, 8)}`);
  beforeAll(() => {
    // "install edgeloop as a dependency": node_modules/edgeloop is this package.
    mkdirSync(join(outside, "node_modules"));
    symlinkSync(ROOT, join(outside, "node_modules", "edgeloop"), "dir");
    mkdirSync(inside);
  });
  afterAll(() => {
    rmSync(outside, { recursive: true, force: true });
    rmSync(inside, { recursive: true, force: true });
  });

  for (const [where, dir] of [["outside the repository, edgeloop a dependency (exports map)", outside], ["inside the repository (self-reference)", inside]] as const) {
    test(where, async () => {
      const r = await runIn(dir);
      expect({ code: r.code, stderr: r.code === 0 ? "" : r.stderr }).toEqual({ code: 0, stderr: "" });
      const out = JSON.parse(r.stdout.trim().split("\n").at(-1)!) as { num_turns: number; reward_score: number; text: string; mask: number[] }[];
      expect(out.map(({ mask: _m, ...o }) => o)).toEqual(EXPECTED);
      // Sampled turns mask 1, the fixed user turn (and the template's boundaries) mask 0.
      expect(out[0]!.mask.filter((m) => m === 0).length).toBeGreaterThan(10);
    }, HANG_MS);
  }

  test("the exports map names the public entry points only (no wildcard: everything else is internal)", () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
    expect(pkg.name).toBe("edgeloop");
    expect(Object.keys(pkg.exports)).toEqual(["./agent-loop", "./schema", "./models", "./engines", "./transfer-queue", "./functions", "./worker", "./sim-engine", "./package.json"]);
    expect(Object.entries(pkg.exports).filter(([k, v]) => k.includes("*") || String(v).includes("*"))).toEqual([]);
  });
});

describe.skipIf(!redis)("§3's Worker entry, from outside the repository, bundled by wrangler and run in workerd", () => {
  let s: Services;
  let w: Workerd;
  let mf: Miniflare;
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-doc-worker-"));
  beforeAll(async () => {
    mkdirSync(join(dir, "node_modules"));
    symlinkSync(ROOT, join(dir, "node_modules", "edgeloop"), "dir");
    writeFileSync(join(dir, "self-check-loop.ts"), LOOP!);
    writeFileSync(join(dir, "worker.ts"), WORKER!);
    // "point main in wrangler.toml at it": the project's own wrangler.toml, edgeloop's with main replaced.
    writeFileSync(join(dir, "wrangler.toml"), readFileSync(join(ROOT, "wrangler.toml"), "utf8").replace(/^main = .*$/m, 'main = "worker.ts"'));
    s = await startServices("doc-worker");
    w = await startWorkerd(workerBindings(s), join(dir, "worker.ts"));
    mf = w.mf;
  }, HANG_MS);
  afterAll(async () => {
    await w?.stop();
    await s?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("rows naming self_check_agent run the documented loop in Durable Objects (num_turns 4)", async () => {
    const row = { data_source: "doc", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" }, agent_name: "self_check_agent", uid: "docw0" };
    const res = await mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [row] }) });
    expect({ status: res.status, body: res.status === 202 ? null : await res.text() }).toEqual({ status: 202, body: null });
    // n = 2 (the runtime tests' EDGELOOP_CONFIG): two sessions of one record each.
    expect(await awaitGroups(s.prefix, ["docw0"])).toEqual([["docw0", 2, 2, 2, 0]]);
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix: s.prefix });
    try {
      for (const sid of [0, 1]) {
        expect((await q.sessionRecords("docw0", sid))!.map((r) => [r.key, r.agent_name, r.error, r.num_turns])).toEqual([[`docw0_${sid}_0`, "self_check_agent", null, 4]]);
      }
    } finally {
      await q.close();
    }
  }, HANG_MS);
});
