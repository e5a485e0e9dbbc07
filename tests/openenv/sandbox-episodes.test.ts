import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify as toYaml, parse as parseYaml } from "yaml";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startExampleEnv, type ExampleEnvServer } from "../../infra/openenv/example-env.ts";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { ConfigError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// openenv_agent on per-episode containers (openenv.base_url: "sandbox"): the example sandbox provider with
// `openenv: true` runs one guess-the-number environment per sandbox and names it in the create reply's base_url;
// every trajectory gets its own sandbox, hence its own episode, and its records are token-identical to the same
// rows played against one fixed server (the example env over WebSocket: one environment per connection).
const ROOT = join(import.meta.dir, "..", "..");
const hasRedis = await requireRedis();
const prefixes: string[] = [];
const dir = mkdtempSync(join(tmpdir(), "edgeloop-openenv-sbx-"));
const rows = readFileSync(join(ROOT, "examples", "openenv-guess.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
const example = parseYaml(readFileSync(join(ROOT, "examples", "openenv.yaml"), "utf8")) as { rollout: Record<string, unknown>; openenv: Record<string, unknown> };
const runtimes: Runtime[] = [];
let provider: SandboxProvider;
let plain: SandboxProvider;
let env: ExampleEnvServer;

/** A config file: examples/openenv.yaml with `openenv` over it. */
function configFile(name: string, openenv: Record<string, unknown>): string {
  const file = join(dir, name);
  writeFileSync(file, toYaml({ ...example, openenv: { ...example.openenv, ...openenv } }));
  return file;
}

/** A tools file with no tools and a sandbox block at provider `p`. */
function toolsFile(name: string, p: SandboxProvider): string {
  const file = join(dir, name);
  writeFileSync(file, JSON.stringify({ tools: [], sandbox: { create_url: `${p.url}/sandboxes/create`, release_url: `${p.url}/sandboxes/release`, ttl_s: 30, max_creates_per_s: 100, create_burst: 10 } }));
  return file;
}

async function runtime(flags: Parameters<typeof buildRuntime>[0]): Promise<Runtime> {
  const r = await buildRuntime({ script: join(ROOT, "examples", "policy-openenv.json"), n: 2, seed: 5, promptLength: 512, responseLength: 2048, maxModelLen: 4096, ...flags });
  runtimes.push(r);
  return r;
}

/** The records of a batch of the example rows, uids `{tag}{row index}` (a lease id names its key: one provider never sees a key twice), by key. */
async function records(r: Runtime, tag: string): Promise<TrajectoryRecord[]> {
  const { run } = await r.service.accept({ rows: rows.map((row, i) => ({ ...row, uid: `${tag}${i}` })), global_steps: -1, model_version: null, validate: false });
  const out: TrajectoryRecord[] = [];
  for await (const rec of run.stream()) out.push(rec);
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

beforeAll(() => {
  provider = startSandboxProvider({ port: 0, openenv: true });
  plain = startSandboxProvider({ port: 0 });
  env = startExampleEnv({ port: 0 });
});
afterAll(async () => {
  for (const r of runtimes) await r.close();
  for (const p of prefixes) await deleteByPrefix(p);
  await provider?.stop();
  await plain?.stop();
  await env?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** The records of the rows against one fixed server (the example env over WebSocket), once. */
let fixedRecords: Promise<TrajectoryRecord[]> | undefined;

/**
 * N trajectories, N sandboxes, N episodes on the example (`store`: extra runtime flags — a Redis store runs each
 * trajectory as a durable session), checked against the fixed server's records.
 */
async function perEpisode(tag: string, store: Partial<Parameters<typeof buildRuntime>[0]>): Promise<void> {
  const n = rows.length * 2;
  const before = provider.stats();
  // The runnable example (examples/openenv-sandbox.*, docs/environments.md "Per-episode containers"), its provider on a free port.
  const tools = join(dir, "openenv-sandbox-tools.json");
  writeFileSync(tools, readFileSync(join(ROOT, "examples", "openenv-sandbox-tools.json"), "utf8").replaceAll("http://127.0.0.1:8125/", `${provider.url}/`));
  const sbx = await records(await runtime({ config: join(ROOT, "examples", "openenv-sandbox.yaml"), tools, ...store }), tag);
  const fixed = await (fixedRecords ??= runtime({ config: configFile("fixed.yaml", { base_url: env.url, transport: "websocket" }) }).then((r) => records(r, "fx")));
  expect(sbx.map((r) => r.error)).toEqual(sbx.map(() => null));
  expect(fixed.map((r) => r.error)).toEqual(fixed.map(() => null));
  expect(sbx.length).toBe(n);

  const after = provider.stats();
  expect(after.created - before.created).toBe(n);
  expect(after.releases - before.releases).toBe(n);
  expect(after.live).toBe(0);
  expect((after.releases_by_reason.finished ?? 0) - (before.releases_by_reason.finished ?? 0)).toBe(n);
  // One reset per sandbox, one step per env step of its trajectory.
  const steps = sbx.reduce((k, r) => k + (r.extra_fields.env_steps as number), 0);
  expect({ reset: after.env_requests.reset! - (before.env_requests.reset ?? 0), step: after.env_requests.step! - (before.env_requests.step ?? 0) }).toEqual({ reset: n, step: steps });

  const sandboxes = sbx.map((r) => r.extra_fields.sandbox as { lease_id: string; sandbox_id: string });
  expect(new Set(sandboxes.map((s) => s.sandbox_id)).size).toBe(n);
  for (const [i, r] of sbx.entries()) {
    const s = sandboxes[i]!;
    expect(s.lease_id).toBe(`${r.key}~1`);
    expect(r.extra_fields.openenv).toEqual({ url: `${provider.url}/envs/${s.sandbox_id}`, transport: "http" });
    const f = fixed[i]!;
    // Keys differ by the uid's tag only; sampling seeds follow the row's position and session, not its uid.
    expect(r.key.slice(tag.length)).toBe(f.key.slice(2));
    // The same tokens, masks, log-probs, rewards and turn scores as against one fixed server.
    expect(r.prompt_ids).toEqual(f.prompt_ids);
    expect(r.response_ids).toEqual(f.response_ids);
    expect(r.response_mask).toEqual(f.response_mask);
    expect(r.rollout_log_probs).toEqual(f.rollout_log_probs);
    expect([r.num_turns, r.finish_reason, r.truncated]).toEqual([f.num_turns, f.finish_reason, f.truncated]);
    expect(r.reward_score).toBe(f.reward_score);
    expect(r.extra_fields.turn_scores).toEqual(f.extra_fields.turn_scores);
    expect(r.extra_fields.terminated_by).toBe("env_done");
    const { sandbox: _s, openenv: _o, ...rest } = r.extra_fields;
    const { openenv: _fo, ...fixedRest } = f.extra_fields;
    expect(rest).toEqual(fixedRest);
  }
  // A batch with mixed rewards (the policy solves some targets, not others).
  const wins = sbx.filter((r) => (r.extra_fields.turn_scores as number[]).at(-1) === 1).length;
  expect(wins).toBeGreaterThan(0);
  expect(wins).toBeLessThan(n);
}

describe("openenv.base_url: sandbox", () => {
  test("N trajectories, N sandboxes, N episodes: created and released once each; records token-identical to a fixed base_url", async () => {
    await perEpisode("m", {});
  }, HANG_MS);

  test.skipIf(!hasRedis)("the same as durable sessions (Redis store: checkpoints and leases in Redis)", async () => {
    const prefix = randomPrefix("oe-sbx-rt");
    prefixes.push(prefix);
    await perEpisode("r", { store: REDIS_URL, storePrefix: prefix });
  }, HANG_MS);

  test("a provider whose create reply has no base_url: every trajectory fails naming base_url, and its sandbox is released", async () => {
    const before = plain.stats();
    const recs = await records(await runtime({ config: configFile("sandbox2.yaml", { base_url: "sandbox", transport: "http" }), tools: toolsFile("tools-plain.json", plain) }), "p");
    expect(recs.length).toBe(rows.length * 2);
    const after = plain.stats();
    expect(after.created - before.created).toBe(recs.length);
    expect(after.releases - before.releases).toBe(recs.length);
    expect(after.releases_by_reason.failed).toBe(recs.length);
    for (const r of recs) {
      expect(r.error).toStartWith("OpenEnvError: openenv: sandbox sbx-");
      expect(r.error).toEndWith(` (lease ${r.key}~1) has no base_url: with openenv.base_url "sandbox" the sandbox provider's create reply must carry base_url (the http(s) URL of the OpenEnv server in that sandbox)`);
    }
  }, HANG_MS);

  test("without a sandbox block in the tools file: a ConfigError at start naming openenv.base_url", async () => {
    const e = await buildRuntime({ config: configFile("nosbx.yaml", { base_url: "sandbox", transport: "http" }) }).then(
      (r) => (runtimes.push(r), null),
      (x: unknown) => x,
    );
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as ConfigError).field).toBe("openenv.base_url");
    expect((e as ConfigError).message).toBe(`config openenv.base_url: "sandbox" plays each trajectory's own sandbox, so the tools file needs a sandbox block (its provider's create reply names the environment's base_url): set tools.file (--tools)`);
  }, HANG_MS);
});
