/**
 * Where the samples of one prompt group part ways, on token ids.
 *
 * Each sample is compared as one sequence `prompt_ids ‖ response_ids`
 * (positions count from the first prompt token; subtract the prompt length for
 * a `response_ids` index). The longest common prefix (LCP) of two samples is
 * the first position where their ids differ, or the shorter length when one
 * is a prefix of the other.
 *
 * Sorting the sequences lexicographically puts, next to each one, the sample
 * it shares the longest prefix with (a standard property of sorted strings:
 * `LCP(a, c) = min(LCP(a, b), LCP(b, c))` for `a ≤ b ≤ c`), so everything
 * below costs n log n comparisons plus one pass over neighbours, not n² LCPs.
 */

/** One sample of a group: its trajectory key and `prompt_ids ‖ response_ids`. */
export interface DivergenceSample {
  key: string;
  ids: ArrayLike<number>;
}

/**
 * How one sample leaves the others. Samples equal to it token for token
 * (`same_as`) go together: what counts is where they, as one, leave the rest.
 * - `at`: the first position (in `prompt ‖ response`) that no sample other than
 *   its equals shares with it — the largest LCP with any sample that differs;
 *   positions before it are shared with `nearest`. When every sample is equal, its length.
 * - `kind`: `token` — the sample has a token at `at` that `nearest` does not
 *   (another token, or `nearest` ended there); `ended` — the sample ends at `at`
 *   while `nearest` goes on; `identical` — every other sample equals it.
 * - `nearest`: the differing sample it shares that prefix with (the first such in
 *   input order), null when every sample equals it.
 */
export interface SampleDivergence {
  key: string;
  at: number;
  kind: "token" | "ended" | "identical";
  nearest: string | null;
  /** Keys of the other samples equal to this one, in input order. */
  same_as: string[];
  /** Length of this sample's `prompt ‖ response`. */
  length: number;
}

/**
 * A group's divergence: `common_prefix` is the number of leading tokens every
 * sample shares (the first position where they do not all agree; the length
 * of the shortest sample when all agree up to it); `samples` follows the input
 * order. A group of one sample has `common_prefix` = its length and no `samples` entries.
 */
export interface GroupDivergence {
  common_prefix: number;
  samples: SampleDivergence[];
}

/** Longest common prefix of two id sequences. */
export function commonPrefix(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

function compareIds(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const p = commonPrefix(a, b);
  if (p < a.length && p < b.length) return a[p]! - b[p]!;
  return a.length - b.length;
}

/**
 * Computes where each sample of a group diverges from the others (see
 * {@link SampleDivergence}). Pure; the input is not modified. Ties in `nearest`
 * go to the sample earlier in the input.
 * @example groupDivergence([{key: "a", ids: [1, 2, 3]}, {key: "b", ids: [1, 2, 4]}]) →
 *   `{common_prefix: 2, samples: [{key: "a", at: 2, kind: "token", nearest: "b", same_as: [], length: 3}, {key: "b", at: 2, …}]}`
 */
export function groupDivergence(samples: readonly DivergenceSample[]): GroupDivergence {
  if (samples.length === 0) return { common_prefix: 0, samples: [] };
  if (samples.length === 1) return { common_prefix: samples[0]!.ids.length, samples: [] };
  const order = samples.map((_, i) => i).sort((x, y) => compareIds(samples[x]!.ids, samples[y]!.ids) || x - y);
  // Equal sequences sit next to each other once sorted: one cluster each (members in input order).
  const clusters: number[][] = [];
  for (const x of order) {
    const last = clusters.at(-1);
    if (last && compareIds(samples[last[0]!]!.ids, samples[x]!.ids) === 0) last.push(x);
    else clusters.push([x]);
  }
  const ids = (c: number) => samples[clusters[c]![0]!]!.ids;
  // lcpNext[c]: LCP of the sorted clusters c and c+1.
  const lcpNext = clusters.slice(0, -1).map((_, c) => commonPrefix(ids(c), ids(c + 1)));
  const common = clusters.length === 1 ? ids(0).length : Math.min(...lcpNext);
  const out = new Array<SampleDivergence>(samples.length);
  clusters.forEach((members, c) => {
    const len = ids(c).length;
    let at = len;
    let nearest: number | null = null;
    if (clusters.length > 1) {
      at = Math.max(c > 0 ? lcpNext[c - 1]! : -1, c < clusters.length - 1 ? lcpNext[c]! : -1);
      // The clusters sharing `at` leading tokens with this one, outward from it; nearest = first in input order.
      for (let lo = c - 1; lo >= 0 && lcpNext[lo]! >= at; lo--) nearest = Math.min(nearest ?? Infinity, clusters[lo]![0]!);
      for (let hi = c; hi < lcpNext.length && lcpNext[hi]! >= at; hi++) nearest = Math.min(nearest ?? Infinity, clusters[hi + 1]![0]!);
    }
    const kind = nearest === null ? "identical" : at === len ? "ended" : "token";
    for (const i of members) {
      out[i] = { key: samples[i]!.key, at, kind, nearest: nearest === null ? null : samples[nearest]!.key, same_as: members.filter((j) => j !== i).map((j) => samples[j]!.key), length: len };
    }
  });
  return { common_prefix: common, samples: out };
}

/**
 * The text around position `at` of a sample, from its per-token text
 * (`pieces`, one string per id of `prompt ‖ response`): up to `before` tokens
 * before, the token at `at` (`""` past the end), up to `after` tokens after.
 */
export function textAround(pieces: readonly string[], at: number, before = 8, after = 8): { before: string; at: string; after: string } {
  return {
    before: pieces.slice(Math.max(0, at - before), Math.max(0, at)).join(""),
    at: pieces[at] ?? "",
    after: pieces.slice(at + 1, at + 1 + after).join(""),
  };
}
