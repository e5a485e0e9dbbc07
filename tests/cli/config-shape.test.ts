import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { mergeConfig, parseAppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { REDIS_URL } from "../helpers/redis.ts";

// A config section of the wrong type (a list, a number, a string; a whole file that is not a mapping) used to be
// replaced by the flags' section of the same name and ignored: the run went on with defaults.

const dir = mkdtempSync(join(tmpdir(), "edgeloop-cfg-shape-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("mergeConfig keeps a non-object where the override has a section; objects merge; null and absent take the override", () => {
  expect(mergeConfig({ rollout: [{ n: 3 }] }, { rollout: { n: 2 } })).toEqual({ rollout: [{ n: 3 }] });
  expect(mergeConfig([1, 2], { rollout: { n: 2 } })).toEqual([1, 2]);
  expect(mergeConfig({ rollout: { n: 3, seed: 1 } }, { rollout: { n: 2, seed: undefined } })).toEqual({ rollout: { n: 2, seed: 1 } });
  expect(mergeConfig({ rollout: { filter_groups: null } }, { rollout: { filter_groups: { metric: "reward" } } })).toEqual({ rollout: { filter_groups: { metric: "reward" } } });
  expect(mergeConfig(undefined, { rollout: { n: 2 } })).toEqual({ rollout: { n: 2 } });
  expect(mergeConfig({ rollout: { oversample: 1.5 } }, { rollout: { oversample: null } })).toEqual({ rollout: { oversample: null } });
});

for (const [text, path, what] of [
  ["rollout: [{n: 3}]", "rollout", "received array"],
  ["rollout: 5", "rollout", "received number"],
  ["engine: [x]", "engine", "received array"],
  ["rollout: {multi_turn: [1]}", "rollout.multi_turn", "received array"],
  ["[1, 2]", "(root)", "received array"],
  ["just a string", "(root)", "received string"],
] as const) {
  test(`a config file with \`${text}\` is refused at start naming ${path}`, async () => {
    const file = join(dir, `c-${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(file, `${text}\n`);
    const e = await buildRuntime({ config: file, n: 2 }).then(
      async (rt) => {
        await rt.close();
        return null;
      },
      (err: unknown) => err,
    );
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as ConfigError).message).toContain(`${path}: Invalid input: expected object, ${what}`);
  });
}

test("the per-batch override of a nullable section still applies", () => {
  const base = parseAppConfig({});
  const merged = parseAppConfig(mergeConfig(base, { rollout: { filter_groups: { metric: "reward", drop_if: "all_equal" } } }));
  expect(merged.rollout.filter_groups).toEqual({ metric: "reward", drop_if: "all_equal" });
});

test("a Redis URL naming a database that does not exist, or a path that is no database number, is refused at start naming store.url", async () => {
  const { checkRedis, redisDatabase } = await import("../../infra/redis/redis-check.ts");
  expect([redisDatabase("redis://h:6379"), redisDatabase("redis://h:6379/"), redisDatabase("redis://:pw@h:6379/3")]).toEqual([null, null, 3]);
  expect(() => redisDatabase("redis://h:6379/abc")).toThrow("config store.url: '/abc' is not a database number (redis://host:port/N)");
  const url = REDIS_URL;
  const e = await checkRedis(`${url.replace(/\/\d*$/, "")}/99`).then(() => null, (err: unknown) => err);
  expect(e).toBeInstanceOf(ConfigError);
  expect((e as ConfigError).message).toMatch(/^config store\.url: database 99 of redis:\/\/.+\/99: ERR DB index is out of range$/);
  await checkRedis(`${url.replace(/\/\d*$/, "")}/3`);
});

test("an empty store prefix is refused (it would write unprefixed keys into the database)", () => {
  expect(() => parseAppConfig({ store: { prefix: "" } })).toThrow(/^config store\.prefix: must not be empty/);
});

// Millisecond durations end in setTimeout / AbortSignal.timeout, which fire at once above 2^31 − 1 (Bun warns
// TimeoutOverflowWarning and uses 1 ms); retries beyond 10 made start-up sit silent for minutes.
const TIMER_MS_FIELDS: [string, string, number][] = [
  ["engine", "timeout_ms", 1],
  ["gateway", "attempt_timeout_ms", 1],
  ["gateway", "cooldown_ms", 0],
  ["gateway", "health_interval_ms", 0],
  ["gateway", "lease_ttl_ms", 300],
  ["gateway", "pin_ttl_ms", 1000],
  ["agent", "timeout_ms", 1],
  ["reward", "timeout_ms", 1],
];
for (const [section, key] of TIMER_MS_FIELDS) {
  test(`${section}.${key} above setTimeout's largest delay is refused naming it; 2147483647 parses`, () => {
    for (const bad of [2_147_483_648, 3_000_000_000, 1e12]) {
      expect(() => parseAppConfig({ [section]: { [key]: bad } })).toThrow(`config ${section}.${key}: must be <= 2147483647 (milliseconds; setTimeout's largest delay) (in config)`);
    }
    expect((parseAppConfig({ [section]: { [key]: 2_147_483_647 } }) as unknown as Record<string, Record<string, number>>)[section]![key]).toBe(2_147_483_647);
  });
}

test("rollout.teacher.timeout_ms above setTimeout's largest delay is refused naming it; 2147483647 parses", () => {
  expect(() => parseAppConfig({ rollout: { teacher: { url: "sim", timeout_ms: 3_000_000_000 } } })).toThrow(
    "config rollout.teacher.timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay) (in config)",
  );
  expect(parseAppConfig({ rollout: { teacher: { url: "sim", timeout_ms: 2_147_483_647 } } }).rollout.teacher!.timeout_ms).toBe(2_147_483_647);
});

for (const section of ["engine", "reward"]) {
  test(`${section}.max_retries above 100 is refused naming the bound; 100 parses (its bound before the tools' 0..10)`, () => {
    expect(() => parseAppConfig({ [section]: { max_retries: 101 } })).toThrow(`config ${section}.max_retries: must be <= 100 (retries after the first attempt) (in config)`);
    expect(() => parseAppConfig({ [section]: { max_retries: 1000 } })).toThrow(`config ${section}.max_retries: must be <= 100 (retries after the first attempt) (in config)`);
    expect((parseAppConfig({ [section]: { max_retries: 100 } }) as unknown as Record<string, { max_retries: number }>)[section]!.max_retries).toBe(100);
  });
}

test("the reward webhook spec takes the same bounds (http(s) url, timer ms, retries)", async () => {
  const { RewardWebhookSpec } = await import("../../shared/reward/webhook-reward.ts");
  const issue = (v: unknown) => RewardWebhookSpec.safeParse(v).error?.issues[0]?.message;
  expect(issue({ url: "ftp://x/" })).toBe("must be an http: or https: URL");
  expect(issue({ url: "http://x/", timeout_ms: 3_000_000_000 })).toBe("must be <= 2147483647 (milliseconds; setTimeout's largest delay)");
  expect(issue({ url: "http://x/", max_retries: 11 })).toBe("must be <= 10 (retries after the first attempt)");
  expect(RewardWebhookSpec.parse({ url: "https://x/", timeout_ms: 2_147_483_647, max_retries: 10 })).toMatchObject({ timeout_ms: 2_147_483_647, max_retries: 10 });
});
