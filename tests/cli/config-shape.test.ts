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
