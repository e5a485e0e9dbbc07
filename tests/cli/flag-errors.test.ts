import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { msFlag, secondsFlag } from "../../infra/cli/flag-parsers.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Every flag or argument the CLI refuses — commander's own parse errors and every numeric flag's
// range — ends with exactly one line naming the flag and exit code 2 (README: 2 = config/input error),
// never a silently ignored value, a default in its place, or commander's exit code 1 with help text.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-flags-"));
// A readable data file, so that a case's error is the flag's and not --data's.
writeFileSync(join(dir, "x.jsonl"), readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0] + "\n");
const prefixes: string[] = [];
afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  for (const p of prefixes) await deleteByPrefix(p);
});

function edgeloop(args: string[]): { code: number; stdout: string; stderr: string } {
  const p = Bun.spawnSync([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", EDGELOOP_DEBUG: "" }, timeout: HANG_MS });
  return { code: p.exitCode ?? -1, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

const CASES: [string[], string][] = [
  [["rollout", "--data", "x.jsonl", "--n", "abc"], "--n must be an integer >= 1, got 'abc' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--n", "0"], "--n must be an integer >= 1, got '0' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--store-timeout", "-1"], "--store-timeout must be a positive number of seconds, got '-1' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--concurrency", ""], "--concurrency must be an integer 1..100000, got '' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--global-steps", "1.5"], "--global-steps must be an integer >= -1, got '1.5' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--engine-format", "tgi"], "--engine-format 'tgi': Allowed choices are vllm, vllm-generate, sglang. (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--bogus"], "unknown option '--bogus' (see edgeloop rollout --help)"],
  [["rollout"], "required option '--data <file>' not specified (see edgeloop rollout --help)"],
  [["worker", "--lease", "0"], "--lease must be a positive number of seconds, got '0' (see edgeloop worker --help)"],
  [["worker", "--lease", "abc"], "--lease must be a positive number of seconds, got 'abc' (see edgeloop worker --help)"],
  [["worker", "--idle-exit", "-1"], "--idle-exit must be a number of seconds >= 0, got '-1' (see edgeloop worker --help)"],
  [["serve", "--max-pending", "0"], "--max-pending must be an integer >= 1, got '0' (see edgeloop serve --help)"],
  [["serve", "--lost-grace", "0"], "--lost-grace must be a positive number of seconds, got '0' (see edgeloop serve --help)"],
  [["serve", "--port", "70000"], "--port must be an integer 0..65535, got '70000' (see edgeloop serve --help)"],
  [["serve", "--port", "0", "--reuse-port"], "--reuse-port: needs a fixed --port (with --port 0 each process gets a port of its own, so none shares one)"],
  [["serve", "--port", "1", "--reuse-port"], "--reuse-port: the memory store lives in this process, so a second serve on the port would answer from another state: use --store redis://… (or an Upstash URL) in queue mode"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--policy", "foo"], "--policy 'foo': Allowed choices are least_inflight_sticky, bounded_load_hash, round_robin. (see edgeloop gateway --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--eject-after", "2.5"], "--eject-after must be an integer >= 1, got '2.5' (see edgeloop gateway --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--cooldown-ms", "-5"], "--cooldown-ms must be an integer >= 0, got '-5' (see edgeloop gateway --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--attempt-timeout-ms", "0"], "--attempt-timeout-ms must be an integer >= 1, got '0' (see edgeloop gateway --help)"],
  [["sim-engine", "--replicas", "0"], "--replicas must be an integer 1..64, got '0' (see edgeloop sim-engine --help)"],
  [["inspect"], "missing required argument 'key' (see edgeloop inspect --help)"],
  [["sim-engine", "--decode-ms-per-token", "-1"], "--decode-ms-per-token must be a number of milliseconds >= 0, got '-1' (see edgeloop sim-engine --help)"],
  [["sim-engine", "--kv-cache-blocks", "0"], "--kv-cache-blocks must be an integer >= 1, got '0' (see edgeloop sim-engine --help)"],
  // Values a parser accepts but no request could use: refused at start, naming the flag (before any data is read).
  [["rollout", "--data", "x.jsonl", "--out", "no-such-folder/out.jsonl"], `--out: the folder ${join(dir, "no-such-folder")} does not exist (create it first, or write elsewhere)`],
  [["rollout", "--data", "x.jsonl", "--out", "."], `--out: ${dir} is a folder; name a file (e.g. ${dir}/rollouts.jsonl)`],
  [["rollout", "--data", "x.jsonl", "--engine", "ftp://gpu1:8000"], `--engine: engine.url must be "sim" or an http(s) URL (got 'ftp://gpu1:8000')`],
  [["rollout", "--data", "x.jsonl", "--agent", "mailto:x@y"], "--agent: agent.url must be an http(s) URL (got 'mailto:x@y')"],
  [["rollout", "--data", "x.jsonl", "--public-url", "localhost:8787"], "--public-url: agent.public_url must be an http(s) URL (got 'localhost:8787')"],
  [["rollout", "--data", "x.jsonl", "--store", "ftp://x"], "--store: store.url must be memory, upstash, a redis:// URL or a redis+cluster://host:port,host:port URL (got 'ftp://x')"],
  [["worker", "--idle-exit", "abc"], "--idle-exit must be a number of seconds >= 0, got 'abc' (see edgeloop worker --help)"],
  [["worker", "--lease", "-5"], "--lease must be a positive number of seconds, got '-5' (see edgeloop worker --help)"],
  // Durations become timers in ms: past setTimeout's largest delay (2^31 − 1 ms) one would fire at once.
  [["worker", "--lease", "2147484"], "--lease must be at most 2147483 seconds (setTimeout's largest delay), got '2147484' (see edgeloop worker --help)"],
  [["worker", "--idle-exit", "1e12"], "--idle-exit must be at most 2147483 seconds (setTimeout's largest delay), got '1e12' (see edgeloop worker --help)"],
  [["worker", "--drain-timeout", "3000000"], "--drain-timeout must be at most 2147483 seconds (setTimeout's largest delay), got '3000000' (see edgeloop worker --help)"],
  [["serve", "--lost-grace", "3000000"], "--lost-grace must be at most 2147483 seconds (setTimeout's largest delay), got '3000000' (see edgeloop serve --help)"],
  [["rollout", "--data", "x.jsonl", "--store-timeout", "2147483.5"], "--store-timeout must be at most 2147483 seconds (setTimeout's largest delay), got '2147483.5' (see edgeloop rollout --help)"],
  [["rollout", "--data", "x.jsonl", "--trajectory-deadline", "0"], "--trajectory-deadline must be an integer 1..2147483, got '0' (see edgeloop rollout --help)"],
  [["serve", "--trajectory-deadline", "2147484"], "--trajectory-deadline must be an integer 1..2147483, got '2147484' (see edgeloop serve --help)"],
  [["rollout", "--data", "x.jsonl", "--agent-timeout-ms", "3000000000"], "--agent-timeout-ms must be at most 2147483647 milliseconds (setTimeout's largest delay), got '3000000000' (see edgeloop rollout --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--attempt-timeout-ms", "2147483648"], "--attempt-timeout-ms must be at most 2147483647 milliseconds (setTimeout's largest delay), got '2147483648' (see edgeloop gateway --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--cooldown-ms", "3000000000"], "--cooldown-ms must be at most 2147483647 milliseconds (setTimeout's largest delay), got '3000000000' (see edgeloop gateway --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--health-interval-ms", "3000000000"], "--health-interval-ms must be at most 2147483647 milliseconds (setTimeout's largest delay), got '3000000000' (see edgeloop gateway --help)"],
  [["worker", "--lease", "NaN"], "--lease must be a positive number of seconds, got 'NaN' (see edgeloop worker --help)"],
  [["worker", "--lease", "0.0001"], "--lease must be at least 0.1 seconds (jobs are heart-beaten every third of it, at least 50 ms apart: a shorter lease hands running jobs to other workers), got '0.0001' (see edgeloop worker --help)"],
  // Jobs run with their batch's rollout section: the worker refuses the flags it would ignore.
  [["worker", "--n", "4"], "--n: a worker runs each job with its batch's rollout.n (serve's config, or the batch's config.rollout); set it on edgeloop serve or in the POST, not on the worker"],
  [["worker", "--trajectory-deadline", "60"], "--trajectory-deadline: a worker runs each job with its batch's rollout.trajectory_deadline_s (serve's config, or the batch's config.rollout); set it on edgeloop serve or in the POST, not on the worker"],
  [["worker", "--default-agent", "tool_agent"], "--default-agent: a worker runs each job with its batch's rollout.agent.default_agent_loop (serve's config, or the batch's config.rollout); set it on edgeloop serve or in the POST, not on the worker"],
  [["cancel", "b1", "--url", "ftp://x"], "--url: 'ftp://x' is not an http(s) URL"],
  [["nonsense"], "unknown command 'nonsense' (see edgeloop --help)"],
  [["gateway", "--replicas", "http://127.0.0.1:1", "--store-prefix", "x:"], "--store-prefix: applies with --store (routing state shared in Redis/Upstash); without a store the gateway keeps its state in memory"],
  [["rollout", "--data", "x.jsonl", "--store-prefix", "x:"], "--store-prefix: applies to a Redis or Upstash store (--store); the memory store has no keys"],
  [["rollout", "--data", "x.jsonl", "--store-timeout", "5"], "--store-timeout: applies to a Redis or Upstash store (--store); the memory store is never unreachable"],
  [["rollout", "--data", "x.jsonl", "--store-shards", "4"], "--store-shards: applies to a Redis store (--store); the memory store has no streams to shard"],
  [["serve", "--port", "0", "--store-shards", "4"], "--store-shards: applies to a Redis store (--store); the memory store has no streams to shard"],
  [["rollout", "--data", "x.jsonl", "--blob-threshold", "0"], "--blob-threshold: applies with a blob store (--blob-store or store.blobs.url); without one every record part stays inline"],
  [["serve", "--port", "0", "--store", "redis://127.0.0.1:6379", "--blob-threshold", "1024"], "--blob-threshold: applies with a blob store (--blob-store or store.blobs.url); without one every record part stays inline"],
  [["rollout", "--data", "x.jsonl", "--tools-secret", ""], "--tools-secret: must not be empty (omit it to run without signatures)"],
  [["serve", "--port", "0", "--max-pending", "2"], "--max-pending: applies to queue mode (a Redis or Upstash store, --jobs queue or auto); here batches run inside serve"],
  [["serve", "--port", "0", "--lost-grace", "5"], "--lost-grace: applies to queue mode (a Redis or Upstash store, --jobs queue or auto); here batches run inside serve"],
  [["inspect", "k_0_0", "--file", "x.jsonl", "--store", "redis://127.0.0.1:6379"], "--store: reads the store; --file reads a JSONL file: give one of them"],
  [["upstash-bridge", "--token", ""], "--token: must not be empty: clients send it as `Authorization: Bearer <token>`"],
  [["rollout", "--data", "x.jsonl", "--out", "./x.jsonl"], `--out: ${join(realpathSync(dir), "x.jsonl")} is the --data file; the records would overwrite the dataset (write elsewhere)`],
  [["rollout", "--data", "x.jsonl", "--model-version", ""], "--model-version must be 1 to 200 characters and not blank, got '' (see edgeloop rollout --help)"],
  // The simulated engine's settings with a real engine: refused, not ignored.
  [["rollout", "--data", "x.jsonl", "--engine", "http://127.0.0.1:1", "--replicas", "4"], `--replicas: engine.replicas applies to the simulated engine only (engine.url "sim"), not to http://127.0.0.1:1 (got '4')`],
  [["rollout", "--data", "x.jsonl", "--engine", "http://127.0.0.1:1", "--script", "p.json"], `--script: engine.script applies to the simulated engine only (engine.url "sim"), not to http://127.0.0.1:1 (got 'p.json')`],
];

describe("flag and argument errors: one line naming the flag, exit 2", () => {
  for (const [args, line] of CASES) {
    test(args.join(" "), () => {
      const r = edgeloop(args);
      expect({ code: r.code, stderr: r.stderr, stdout: r.stdout }).toEqual({ code: 2, stderr: `edgeloop: ${line}\n`, stdout: "" });
    }, HANG_MS);
  }
  test("--version / -V print package.json's version on stdout and exit 0", () => {
    const version = JSON.parse(readFileSync(join(import.meta.dir, "..", "..", "package.json"), "utf8")).version as string;
    expect(version).toMatch(/^\d+\.\d+\.\d+/);
    for (const flag of ["--version", "-V"]) expect(edgeloop([flag])).toEqual({ code: 0, stdout: `${version}\n`, stderr: "" });
  });
  test("a config file's invalid value is its error even when a flag replaces it", () => {
    writeFileSync(join(dir, "four.yaml"), 'rollout: {n: "four"}\n');
    const r = edgeloop(["rollout", "--data", "x.jsonl", "--config", "four.yaml", "--n", "1"]);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 2, stderr: `edgeloop: config rollout.n: Invalid input: expected number, received string (in four.yaml)\n` });
  }, HANG_MS);
  test("--help still exits 0 with the help on stdout", () => {
    const r = edgeloop(["worker", "--help"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("--lease <seconds>");
  });
});

const redis = await requireRedis();
test.skipIf(!redis)("worker --lease 2 is honoured (banner: lease 2000 ms), --idle-exit 0 exits once no job waits", () => {
  const prefix = randomPrefix("flags");
  prefixes.push(prefix);
  const r = edgeloop(["worker", "--store", REDIS_URL, "--store-prefix", prefix, "--lease", "2", "--idle-exit", "0", "--consumer", "flag-test"]);
  expect(r.code).toBe(0);
  expect(r.stderr).toContain(`worker     flag-test: 256 jobs at once from ${prefix}jobs, lease 2000 ms, exits after 0 s idle\n`);
  expect(JSON.parse(r.stdout.trim().split("\n").at(-1)!)).toMatchObject({ consumer: "flag-test", exit: "idle" });
}, HANG_MS);

test("the largest duration flags still parse: 2147483 seconds, 2147483647 milliseconds", () => {
  expect(secondsFlag("--lease")("2147483")).toBe(2_147_483);
  expect(secondsFlag("--idle-exit", { allowZero: true })("0")).toBe(0);
  expect(msFlag("--attempt-timeout-ms", 1)("2147483647")).toBe(2_147_483_647);
  expect(msFlag("--cooldown-ms", 0)("0")).toBe(0);
});
