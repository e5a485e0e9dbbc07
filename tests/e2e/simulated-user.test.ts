import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { createToolsApp } from "../../infra/tools/app.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 18 item 8: simulated users reachable from the tools file (`interactions`), picked per row by
// verl's extra_info.interaction_kwargs.name (the first configured when absent), signed like tools —
// through the CLI and the HTTP API, on the in-process (memory store) and the durable (Redis sessions) path.
const redis = await requireRedis();
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const SECRET = "sim-user-secret";
const dir = mkdtempSync(join(tmpdir(), "edgeloop-sim-user-"));
const prefixes: string[] = [];
let server: ToolServer;

const SYSTEM = { role: "system", content: "End your reply with the final answer after '####'." };
const SCRIPT = {
  seed: 3,
  rules: [
    { when: "Zed has 2 apples and buys 4 more.", turns: ["The answer is 5.\n#### 5", "I rechecked: 2+4=6.\n#### 6"] },
    { when: "Yara has 3 bags of 3 pears.", turns: ["3*3=9.\n#### 9"] },
    { when: "Quin reads 2 pages.", turns: ["#### 2"] },
  ],
};
/** Zed: named simulated user, wrong then right; Yara: no name (→ the first configured), right at once; Quin: no simulated user. */
const ROWS = [
  { q: "Zed has 2 apples and buys 4 more. How many apples?", gt: "6", ik: { name: "gsm8k_user", ground_truth: "6" } },
  { q: "Yara has 3 bags of 3 pears. How many pears?", gt: "9", ik: { ground_truth: "9" } },
  { q: "Quin reads 2 pages. How many pages?", gt: "2", ik: undefined },
].map((r) => ({
  data_source: "edgeloop/arith",
  agent_name: "tool_agent",
  prompt: [SYSTEM, { role: "user", content: r.q }],
  reward_model: { style: "rule", ground_truth: r.gt },
  ...(r.ik ? { extra_info: { interaction_kwargs: r.ik } } : {}),
}));

type Rec = { error: string | null; prompt_ids: number[]; response_ids: number[]; response_mask: number[]; num_turns: number; reward_score: number; extra_fields: Record<string, unknown> };

/** What every path must produce, by row (records sorted by their prompt's question). */
async function expectRecords(recs: Rec[]): Promise<void> {
  const tok = await defaultTokenizer();
  const byQ = (r: Rec) => ROWS.findIndex((row) => tok.decode(r.prompt_ids).includes(row.prompt[1]!.content));
  const sorted = [...recs].sort((a, b) => byQ(a) - byQ(b));
  expect(sorted.map((r) => [byQ(r), r.error, r.num_turns, r.reward_score, r.extra_fields.turn_scores, r.extra_fields.terminated_by])).toEqual([
    [0, null, 5, 1, [0, 1], "interaction"],
    [1, null, 3, 1, [1], "interaction"],
    [2, null, 2, 1, [], "model"],
  ]);
  // Zed: sampled turn 1 (mask 1), the simulated user's turn (mask 0, exact ids), sampled turn 2 (mask 1).
  const zed = sorted[0]!;
  const turn1 = tok.encode("The answer is 5.\n#### 5<|im_end|>");
  const user = [198, 151644, 872, 198, ...tok.encode("5 is not right. Check your work and give the final number after ####."), 151645, 198, 151644, 77091, 198];
  const turn2 = tok.encode("I rechecked: 2+4=6.\n#### 6<|im_end|>");
  expect(zed.response_ids).toEqual([...turn1, ...user, ...turn2]);
  expect(zed.response_mask).toEqual([...turn1.map(() => 1), ...user.map(() => 0), ...turn2.map(() => 1)]);
  // The terminating reply ("That is correct.") is not appended: no trailing mask-0 tokens.
  expect(sorted[1]!.response_ids).toEqual(tok.encode("3*3=9.\n#### 9<|im_end|>"));
}

function writeInputs(name: string, opts: { secret: string | null; interactions?: unknown[] }): { tools: string; rows: string; script: string } {
  const example = JSON.parse(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", String(server.port)));
  if (opts.interactions) example.interactions = opts.interactions;
  const tools = join(dir, `${name}-tools.json`);
  writeFileSync(tools, JSON.stringify(example));
  const rows = join(dir, `${name}-rows.jsonl`);
  writeFileSync(rows, ROWS.map((r) => JSON.stringify(r)).join("\n") + "\n");
  const script = join(dir, `${name}-script.json`);
  writeFileSync(script, JSON.stringify(SCRIPT));
  return { tools, rows, script };
}

async function interactionCount(): Promise<number> {
  const s = (await (await fetch(`${server.url}/stats`)).json()) as { interactions?: Record<string, number> };
  return s.interactions?.gsm8k_user ?? 0;
}

beforeAll(() => {
  // The example tool server (calc, lookup and the gsm8k_user simulated user), requiring signatures.
  server = startToolServer({ port: 0, secret: SECRET });
});
afterAll(async () => {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
  if (redis) for (const p of prefixes) await deleteByPrefix(p);
});

describe("tools file: interactions", () => {
  test("defaults, {port} placeholders, unique names, unknown keys refused with the path", () => {
    const f = parseToolsFile(JSON.stringify({ tools: [], interactions: [{ name: "u", url: "http://127.0.0.1:{port}/interactions/u" }] }), { vars: { port: 9 } });
    expect(f.interactions).toEqual([{ name: "u", url: "http://127.0.0.1:9/interactions/u", timeout_ms: 30_000, max_retries: 2 }]);
    expect(parseToolsFile(JSON.stringify({ tools: [] })).interactions).toEqual([]);
    expect(() => parseToolsFile(JSON.stringify({ tools: [], interactions: [{ name: "u", url: "http://a/" }, { name: "u", url: "http://b/" }] }), { source: "t.json" })).toThrow(
      "config t.json: interactions: interaction names must be unique",
    );
    expect(() => parseToolsFile(JSON.stringify({ tools: [], interactions: [{ name: "u", url: "http://a/", timeout: 5 }] }), { source: "t.json" })).toThrow("config t.json: interactions[0]");
  });
});

describe("the example simulated user (POST /interactions/gsm8k_user)", () => {
  test("right → terminate score 1; wrong → ask again score 0; at max_turns → terminate score 0; unsigned 401; unknown 404", async () => {
    const app = createToolsApp({ secret: SECRET, nowSeconds: () => 1_000 });
    const ask = async (name: string, turn: number, answer: string, ik: Record<string, unknown>, secret: string | null = SECRET) => {
      const raw = JSON.stringify({ key: "u_0_0", turn, messages: [{ role: "user", content: "Q" }, { role: "assistant", content: answer }], interaction_kwargs: ik });
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (secret) headers["x-edgeloop-signature"] = await signatureHeader(secret, raw, 1_000);
      const res = await app.request(`/interactions/${name}`, { method: "POST", headers, body: raw });
      return [res.status, await res.json()];
    };
    expect(await ask("gsm8k_user", 1, "#### 1,234", { ground_truth: 1234 })).toEqual([200, { terminate: true, content: "That is correct.", score: 1 }]);
    expect(await ask("gsm8k_user", 1, "It is 7.", { ground_truth: "8" })).toEqual([
      200,
      { terminate: false, content: "I cannot find a final answer after ####. Check your work and give the final number after ####.", score: 0 },
    ]);
    expect(await ask("gsm8k_user", 2, "#### 7", { ground_truth: "8", max_turns: 2 })).toEqual([200, { terminate: true, content: "That is not right; the answer is 8.", score: 0 }]);
    expect((await ask("gsm8k_user", 1, "#### 8", { ground_truth: "8" }, null))[0]).toBe(401);
    expect(await ask("nobody", 1, "#### 8", {})).toEqual([404, { error: { code: "not_found", message: "unknown simulated user 'nobody'; simulated users: gsm8k_user" } }]);
  });
});

async function cli(args: string[]): Promise<{ code: number; stderr: string; stdout: string }> {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

const paths: [string, boolean][] = [["in-process (memory store)", false]];
if (redis) paths.push(["durable (Redis sessions)", true]);

describe.each(paths)("edgeloop rollout, %s", (label, durable) => {
  test("named and unnamed simulated users run from the tools file, signed; exact tokens and turn_scores", async () => {
    const name = durable ? "cli-redis" : "cli-mem";
    const { tools, rows, script } = writeInputs(name, { secret: SECRET });
    const store = durable ? ["--store", REDIS_URL, "--store-prefix", randomPrefix("sim-user-cli")] : [];
    if (durable) prefixes.push(store[3]!);
    const before = await interactionCount();
    const r = await cli(["rollout", "--tools", tools, "--tools-secret", SECRET, "--script", script, "--data", rows, "--n", "1", "--out", `${name}.jsonl`, "--no-progress", ...store]);
    expect({ code: r.code, stderr: r.code === 0 ? "" : r.stderr }).toEqual({ code: 0, stderr: "" });
    expect(r.stderr).toContain(`; simulated users gsm8k_user`);
    if (durable) expect(r.stderr).toContain("sessions   durable");
    await expectRecords(readFileSync(join(dir, `${name}.jsonl`), "utf8").trim().split("\n").map((l) => JSON.parse(l)));
    // Zed asked twice, Yara once: every request reached the (signature-checking) simulated user.
    expect((await interactionCount()) - before).toBe(3);
  }, HANG_MS);

  test("without tools.secret the signed simulated user refuses (401) and the row fails naming the interaction", async () => {
    const name = durable ? "cli-unsigned-redis" : "cli-unsigned-mem";
    const { tools, rows, script } = writeInputs(name, { secret: null });
    const store = durable ? ["--store", REDIS_URL, "--store-prefix", randomPrefix("sim-user-cli")] : [];
    if (durable) prefixes.push(store[3]!);
    const r = await cli(["rollout", "--tools", tools, "--script", script, "--data", rows, "--n", "1", "--out", `${name}.jsonl`, "--no-progress", ...store]);
    expect(r.code).toBe(0);
    const recs = readFileSync(join(dir, `${name}.jsonl`), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Rec & { finish_reason: string });
    const failed = recs.filter((x) => x.extra_fields.terminated_by === "error").map((x) => [x.finish_reason, x.num_turns, x.extra_fields.error]);
    const refused = `interaction 'gsm8k_user': webhook ${server.url}/interactions/gsm8k_user: HTTP 401 {"error":{"code":"unauthorized","message":"missing, bad or stale x-edgeloop-signature"}}`;
    expect(failed).toEqual([
      ["error", 2, refused],
      ["error", 2, refused],
    ]);
  }, HANG_MS);
});

describe.each(paths)("HTTP API (POST /v1/rollouts), %s", (label, durable) => {
  let rt: Runtime | undefined;
  afterAll(async () => {
    await rt?.close();
  });

  test("rows with extra_info.interaction_kwargs reach the tools file's simulated user; unknown names fail the row naming the field", async () => {
    const { tools, script } = writeInputs(durable ? "api-redis" : "api-mem", { secret: SECRET, interactions: [
      { name: "gsm8k_user", url: `${server.url}/interactions/gsm8k_user`, timeout_ms: 5000, max_retries: 0 },
      { name: "other_user", url: `${server.url}/interactions/nobody`, timeout_ms: 5000, max_retries: 0 },
    ] });
    const prefix = randomPrefix("sim-user-api");
    if (durable) prefixes.push(prefix);
    rt = await buildRuntime({ tools, toolsSecret: SECRET, script, n: 1, ...(durable ? { store: REDIS_URL, storePrefix: prefix } : {}) });
    expect(rt.sessions !== null).toBe(durable);
    const app = createRolloutsApp({ service: rt.service });
    const before = await interactionCount();
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: ROWS }) });
    expect(res.status).toBe(202);
    const { batch_id } = (await res.json()) as { batch_id: string };
    const lines = (await (await app.request(`/v1/rollouts/${batch_id}/trajectories`)).text()).trim().split("\n");
    await expectRecords(lines.map((l) => JSON.parse(l)));
    expect((await interactionCount()) - before).toBe(3);

    const bad = { ...ROWS[1]!, extra_info: { interaction_kwargs: { name: "nobody", ground_truth: "9" } } };
    const res2 = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [bad] }) });
    const id2 = ((await res2.json()) as { batch_id: string }).batch_id;
    const [rec] = (await (await app.request(`/v1/rollouts/${id2}/trajectories`)).text()).trim().split("\n").map((l) => JSON.parse(l) as Rec);
    expect(rec!.error).toContain("extra_info.interaction_kwargs.name: unknown interaction 'nobody'; configured interactions: ['gsm8k_user', 'other_user']");
  }, HANG_MS);
});
