import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// edgeloop rollout's progress as a person reads it (not a terminal: plain lines): the stall warning while a
// hung engine holds a trajectory, and `--jobs queue`, where rollout waits on workers and warns until one comes.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const redis = await requireRedis();
const prefix = randomPrefix("rollout-queue");
let dir: string;
const kills: (() => void)[] = [];
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-progress-"));
  const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n");
  writeFileSync(join(dir, "two.jsonl"), rows.slice(0, 2).join("\n") + "\n");
  writeFileSync(join(dir, "hang.json"), JSON.stringify({ seed: 1, rules: [{ when: "HANG", turns: ["x"], fault: { kind: "hang" } }], default: ["The answer is 1.\n#### 1"] }));
  writeFileSync(join(dir, "h.jsonl"), ['{"prompt":[{"role":"user","content":"quick"}]}', '{"prompt":[{"role":"user","content":"HANG"}]}'].join("\n") + "\n");
});
afterAll(async () => {
  for (const k of kills) k();
  rmSync(dir, { recursive: true, force: true });
  await deleteByPrefix(prefix);
});

function spawn(args: string[]) {
  const p = Bun.spawn([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "" } });
  kills.push(() => p.kill("SIGKILL"));
  let err = "";
  const reading = (async () => {
    for await (const chunk of p.stderr as ReadableStream<Uint8Array>) err += new TextDecoder().decode(chunk);
  })();
  return { p, err: () => err, reading };
}

async function until(cond: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await Bun.sleep(50);
  expect(cond()).toBe(true);
}

test("a hung engine: a stall warning names the engine's timeout and retries while nothing finishes", async () => {
  const r = spawn(["rollout", "--data", "h.jsonl", "--n", "1", "--script", "hang.json", "--stall-warn", "1", "--no-progress"]);
  await until(() => r.err().includes("warning    no session finished"), HANG_MS);
  const warning = r.err().split("\n").find((l) => l.startsWith("warning    no session finished"))!;
  expect(warning).toMatch(/^warning {4}no session finished for \ds: 1\/2 finished, 1 running; waiting on the engine \(1 call\): is it hung\? A request waits up to engine\.timeout_ms \(600000 ms\) and is retried 3 times before its trajectory fails$/);
  expect(r.err()).toMatch(/^progress {3}1\/2 sessions, 1 records \(0 failed\), \d+\.\d sessions\/s, ETA \d+s$/m);
  r.p.kill("SIGINT");
  expect(await r.p.exited).toBe(130);
}, HANG_MS);

test("N5: a hung tool webhook: the stall warning names the tool, not the engine", async () => {
  // A tool server that accepts every request and never answers.
  const hung = Bun.serve({ port: 0, fetch: () => new Promise<Response>(() => {}) });
  kills.push(() => hung.stop(true));
  const example = readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8");
  writeFileSync(join(dir, "tools-hang.json"), example.replaceAll("{port}", String(hung.port)));
  writeFileSync(join(dir, "one.jsonl"), readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0] + "\n");
  const r = spawn(["rollout", "--data", "one.jsonl", "--n", "1", "--tools", "tools-hang.json", "--stall-warn", "1", "--no-progress"]);
  await until(() => r.err().includes("warning    no session finished"), HANG_MS);
  const warning = r.err().split("\n").find((l) => l.startsWith("warning    no session finished"))!;
  expect(warning).toMatch(
    /^warning {4}no session finished for \ds: 0\/1 finished, 1 running; waiting on tool `calc` \(1 call\): a call waits up to the tool's timeout_ms per attempt and is retried max_retries times \(tools file\) before it becomes an error observation$/,
  );
  expect(r.err()).not.toContain("is it hung?");
  r.p.kill("SIGINT");
  expect(await r.p.exited).toBe(130);
}, HANG_MS);

test.skipIf(!redis)("--jobs queue: rollout enqueues, warns while no worker runs, and finishes with the records once a worker comes", async () => {
  const store = ["--store", REDIS_URL, "--store-prefix", prefix];
  const r = spawn(["rollout", "--data", "two.jsonl", "--n", "2", "--jobs", "queue", "--out", "q.jsonl", "--stall-warn", "1", "--no-progress", ...store]);
  await until(() => r.err().includes("warning    no session finished"), HANG_MS);
  expect(r.err()).toContain(`jobs       queue: batches become jobs in ${prefix}jobs; run \`edgeloop worker\` with the same --store to process them`);
  expect(r.err()).toMatch(new RegExp(`^warning {4}no session finished for \\ds: 0/4 finished, 0 running; its jobs wait in ${prefix.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}jobs for workers: is an \`edgeloop worker\` running with the same --store\\?$`, "m"));
  const w = spawn(["worker", "--idle-exit", "2", ...store]);
  expect(await r.p.exited).toBe(0);
  await r.reading;
  expect(r.err()).toMatch(/^progress {3}4\/4 sessions, 4 records \(0 failed\), \d+\.\d sessions\/s$/m);
  expect(r.err()).toContain("wrote 4 records to q.jsonl");
  const recs = readFileSync(join(dir, "q.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { key: string; error: string | null });
  expect(recs.map((x) => x.key.replace(/^.*_(\d+_\d+)$/, "$1")).sort()).toEqual(["0_0", "0_0", "1_0", "1_0"]);
  expect(recs.every((x) => x.error === null)).toBe(true);
  expect(await w.p.exited).toBe(0);
}, HANG_MS);
