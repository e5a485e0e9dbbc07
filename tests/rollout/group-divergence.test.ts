import { afterAll, beforeAll, expect, test } from "bun:test";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { commonPrefix, groupDivergence, textAround, type DivergenceSample } from "../../shared/rollout/group-divergence.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { tokenPieces } from "../../shared/telemetry/token-pieces.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { groupRows, writeGroupScript } from "../viewer/group-fixture.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Real groups: four samples of each of three prompts from the simulated engine playing one text
// at a length drawn per trajectory key (deterministic: fixed uids, seed 1), Qwen3 tokens.
let runtime: Runtime;
let records: TrajectoryRecord[];
const group = (uid: string) => records.filter((r) => r.uid === uid).sort((a, b) => a.session_id - b.session_id);
const asSamples = (rs: TrajectoryRecord[]): DivergenceSample[] => rs.map((r) => ({ key: r.key, ids: [...r.prompt_ids, ...r.response_ids] }));

beforeAll(async () => {
  runtime = await buildRuntime({ n: 4, seed: 1, script: writeGroupScript() });
  const b = runtime.service.submit({ rows: groupRows(3), global_steps: 1, model_version: null, validate: false });
  await b.run.run();
  records = [...b.run.records()];
}, HANG_MS);
afterAll(() => runtime?.close());

test("the real groups: lengths and rewards the positions below rest on", () => {
  expect(["grp-0", "grp-1", "grp-2"].map((u) => group(u).map((r) => [r.prompt_ids.length, r.response_ids.length, r.reward_score]))).toEqual([
    [[20, 21, 1], [20, 24, 1], [20, 8, 1], [20, 8, 1]],
    [[20, 3, 0], [20, 3, 0], [20, 13, 1], [20, 19, 1]],
    [[20, 29, 1], [20, 6, 1], [20, 4, 1], [20, 9, 1]],
  ]);
});

test("four distinct samples: each one's divergence position, its nearest sample, and the tokens there", async () => {
  const rs = group("grp-2");
  const d = groupDivergence(asSamples(rs));
  expect(d).toEqual({
    common_prefix: 23,
    samples: [
      { key: "grp-2_0_0", at: 28, kind: "token", nearest: "grp-2_3_0", same_as: [], length: 49 },
      { key: "grp-2_1_0", at: 25, kind: "token", nearest: "grp-2_0_0", same_as: [], length: 26 },
      { key: "grp-2_2_0", at: 23, kind: "token", nearest: "grp-2_0_0", same_as: [], length: 24 },
      { key: "grp-2_3_0", at: 28, kind: "token", nearest: "grp-2_0_0", same_as: [], length: 29 },
    ],
  });
  const tok = await defaultTokenizer();
  const pieces = rs.map((r) => tokenPieces(tok, [...r.prompt_ids, ...r.response_ids]));
  // Response index = position − 20 (the prompt). grp-2_2_0 says "#### 4" and stops where the others go on with " is".
  expect(textAround(pieces[2]!, 23, 3, 2)).toEqual({ before: "#### 4", at: "<|im_end|>", after: "" });
  expect(pieces[2]!.slice(20, 23)).toEqual(["####", " ", "4"]);
  expect(textAround(pieces[0]!, 23, 3, 2)).toEqual({ before: "#### 4", at: " is", after: " the answer" });
  // grp-2_3_0 stops after one sentence where grp-2_0_0 starts the next.
  expect(textAround(pieces[3]!, 28, 4, 0)).toEqual({ before: " the answer. ", at: "<|im_end|>", after: "" });
  expect(textAround(pieces[0]!, 28, 4, 2)).toEqual({ before: " the answer. ", at: "####", after: " 4" });
});

test("equal samples go together: they leave the others as one; a pair of pairs has its own split under the common prefix", () => {
  const d = groupDivergence(asSamples(group("grp-1")));
  expect(d).toEqual({
    common_prefix: 22,
    samples: [
      { key: "grp-1_0_0", at: 22, kind: "token", nearest: "grp-1_2_0", same_as: ["grp-1_1_0"], length: 23 },
      { key: "grp-1_1_0", at: 22, kind: "token", nearest: "grp-1_2_0", same_as: ["grp-1_0_0"], length: 23 },
      { key: "grp-1_2_0", at: 32, kind: "token", nearest: "grp-1_3_0", same_as: [], length: 33 },
      { key: "grp-1_3_0", at: 32, kind: "token", nearest: "grp-1_2_0", same_as: [], length: 39 },
    ],
  });
  expect(groupDivergence(asSamples(group("grp-0"))).samples.map((s) => [s.at, s.nearest, s.same_as])).toEqual([
    [40, "grp-0_1_0", []],
    [40, "grp-0_0_0", []],
    [27, "grp-0_0_0", ["grp-0_3_0"]],
    [27, "grp-0_0_0", ["grp-0_2_0"]],
  ]);
  expect(groupDivergence(asSamples(group("grp-0"))).common_prefix).toBe(27);
});

test("small cases: a prefix ends, all identical, one sample, none", () => {
  expect(groupDivergence([{ key: "a", ids: [1, 2] }, { key: "b", ids: [1, 2, 3] }])).toEqual({
    common_prefix: 2,
    samples: [
      { key: "a", at: 2, kind: "ended", nearest: "b", same_as: [], length: 2 },
      { key: "b", at: 2, kind: "token", nearest: "a", same_as: [], length: 3 },
    ],
  });
  expect(groupDivergence([{ key: "a", ids: [5, 6] }, { key: "b", ids: [5, 6] }])).toEqual({
    common_prefix: 2,
    samples: [
      { key: "a", at: 2, kind: "identical", nearest: null, same_as: ["b"], length: 2 },
      { key: "b", at: 2, kind: "identical", nearest: null, same_as: ["a"], length: 2 },
    ],
  });
  expect(groupDivergence([{ key: "a", ids: Int32Array.of(1, 2, 3) }])).toEqual({ common_prefix: 3, samples: [] });
  expect(groupDivergence([])).toEqual({ common_prefix: 0, samples: [] });
  expect(groupDivergence([{ key: "a", ids: [] }, { key: "b", ids: [7] }]).samples.map((s) => [s.at, s.kind])).toEqual([[0, "ended"], [0, "token"]]);
});

test("agrees with the pairwise definition on 400 random groups (n 2–8, small alphabet so prefixes are shared)", () => {
  let seed = 12345;
  const rnd = (k: number) => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) % k;
  for (let g = 0; g < 400; g++) {
    const n = 2 + rnd(7);
    const samples: DivergenceSample[] = [];
    for (let i = 0; i < n; i++) {
      // Branch off an earlier sample sometimes, so that equal samples and long shared prefixes occur.
      const base = i > 0 && rnd(2) ? Array.from(samples[rnd(i)]!.ids).slice(0, rnd(12)) : [];
      const ids = [...base, ...Array.from({ length: rnd(6) }, () => rnd(3))];
      samples.push({ key: `k${i}`, ids });
    }
    const d = groupDivergence(samples);
    const eq = (a: ArrayLike<number>, b: ArrayLike<number>) => a.length === b.length && commonPrefix(a, b) === a.length;
    let common = Infinity;
    for (let i = 0; i < n; i++)
      for (let j = i + 1; j < n; j++) common = Math.min(common, commonPrefix(samples[i]!.ids, samples[j]!.ids));
    expect(d.common_prefix).toBe(common);
    samples.forEach((s, i) => {
      const others = samples.filter((o, j) => j !== i && !eq(o.ids, s.ids));
      const at = others.length ? Math.max(...others.map((o) => commonPrefix(s.ids, o.ids))) : s.ids.length;
      const nearest = others.find((o) => commonPrefix(s.ids, o.ids) === at)?.key ?? null;
      expect(d.samples[i]).toEqual({
        key: s.key,
        at,
        kind: nearest === null ? "identical" : at === s.ids.length ? "ended" : "token",
        nearest,
        same_as: samples.filter((o, j) => j !== i && eq(o.ids, s.ids)).map((o) => o.key),
        length: s.ids.length,
      });
    });
  }
});
