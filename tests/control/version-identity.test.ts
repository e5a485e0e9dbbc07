import { afterAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { MemoryPolicyVersions, PolicyVersionValue, RedisPolicyVersions, versionKey, type PolicyVersions } from "../../shared/rollout/policy-version.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { InputError } from "../../shared/errors.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";

// A number and its decimal string name one policy version (a trainer posts its step as 3, SGLang reports
// weight_version "3"): on every PolicyVersions implementation, setting "3" after 3 changes nothing, either
// form finds the seq, and the consumed report accepts either form. Different texts stay different versions.
const redis = await requireRedis();
const prefix = randomPrefix("vid");
const commanders: IoRedisCommander[] = [];
afterAll(async () => {
  for (const c of commanders) await c.close();
  if (redis) await deleteByPrefix(prefix);
});

const impls: [string, () => PolicyVersions | null][] = [
  ["memory", () => new MemoryPolicyVersions()],
  [
    "redis",
    () => {
      if (!redis) return null;
      const c = new IoRedisCommander(REDIS_URL);
      commanders.push(c);
      return new RedisPolicyVersions(c, { prefix: `${prefix}${commanders.length}:` });
    },
  ],
];

test("versionKey: the text of a version", () => {
  expect([versionKey(3), versionKey("3"), versionKey("v3"), versionKey(3.5)]).toEqual(['"3"', '"3"', '"v3"', '"3.5"']);
});

describe.each(impls)("%s policy versions", (_name, make) => {
  test("3 and \"3\" are one version; \"03\" and 4 are others", async () => {
    const p = make();
    if (!p) return;
    expect(await p.set(3)).toEqual({ version: 3, seq: 1 });
    // The same version in its other form: no bump, reported in the form it was first set with.
    expect(await p.set("3")).toEqual({ version: 3, seq: 1 });
    expect(await p.current()).toEqual({ version: 3, seq: 1 });
    expect([await p.seqOf(3), await p.seqOf("3"), await p.seqOf("03"), await p.seqOf(4)]).toEqual([1, 1, null, null]);
    expect(await p.set("03")).toEqual({ version: "03", seq: 2 });
    expect(await p.set(4)).toEqual({ version: 4, seq: 3 });
    expect(await p.setConsumed("3")).toEqual({ version: "3", seq: 1 });
    expect(await p.setConsumed("4")).toEqual({ version: "4", seq: 3 });
    // Older than what was recorded: unchanged.
    expect(await p.setConsumed(3)).toEqual({ version: "4", seq: 3 });
    const e = await p.setConsumed("5").catch((x) => x);
    expect(e).toBeInstanceOf(InputError);
    expect(e.message).toContain('policy version "5" was never set');
  });
});

test("blank versions are refused everywhere a version enters: PolicyVersionValue and a batch's model_version", () => {
  for (const bad of ["", "   ", "\t\n", "x".repeat(201), "3 ", " 3", "a\nb", "a\u0000b", "v\u007f"]) {
    expect(PolicyVersionValue.safeParse(bad).success).toBe(false);
    const r = RolloutRequest.safeParse({ rows: [{}], model_version: bad });
    expect(r.success).toBe(false);
    expect(r.error!.issues[0]!.path).toEqual(["model_version"]);
  }
  expect(PolicyVersionValue.safeParse(Number.NaN).success).toBe(false);
  for (const ok of ["step-42", "step 42", "v", 3, 0, -1.5]) expect(PolicyVersionValue.safeParse(ok).success).toBe(true);
});
