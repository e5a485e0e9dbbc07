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
 * How one sample leaves the others.
 * - `at`: the first position (in `prompt ‖ response`) no other sample shares with it,
 *   i.e. the largest LCP with any other sample; positions before it are shared with `nearest`.
 * - `kind`: `token` — the sample has a token at `at` that `nearest` does not
 *   (another token, or `nearest` ended there); `ended` — the sample ends at `at`
 *   while `nearest` goes on; `identical` — equal to `nearest` token for token.
 * - `nearest`: the key of the sample it shares that prefix with (the first such in input order;
 *   for a sample ending at `at`, the first one equal to it when there is one).
 */
export interface SampleDivergence {
  key: string;
  at: number;
  kind: "token" | "ended" | "identical";
  nearest: string;
  /** Length of this sample's `prompt ‖ response`. */
  length: number;
}

/**
 * A group's divergence: `common_prefix` is the number of leading tokens every
 * sample shares (the first position where they do not all agree; the length
 * of the shortest sample when all agree up to it); `samples` follows the input
 * order. A group of one sample has `common_prefix` = its length and no samples entries.
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
 *   `{common_prefix: 2, samples: [{key: "a", at: 2, kind: "token", nearest: "b", length: 3}, {key: "b", at: 2, …}]}`
 */
export function groupDivergence(samples: readonly DivergenceSample[]): GroupDivergence {
  if (samples.length === 0) return { common_prefix: 0, samples: [] };
  if (samples.length === 1) return { common_prefix: samples[0]!.ids.length, samples: [] };
  const order = samples.map((_, i) => i).sort((x, y) => compareIds(samples[x]!.ids, samples[y]!.ids) || x - y);
  // lcpNext[r]: LCP of the sorted samples r and r+1.
  const lcpNext = order.slice(0, -1).map((x, r) => commonPrefix(samples[x]!.ids, samples[order[r + 1]!]!.ids));
  const common = Math.min(...lcpNext);
  const rank = new Array<number>(samples.length);
  order.forEach((x, r) => (rank[x] = r));
  const out = samples.map((s, i): SampleDivergence => {
    const r = rank[i]!;
    const best = Math.max(r > 0 ? lcpNext[r - 1]! : -1, r < order.length - 1 ? lcpNext[r]! : -1);
    // Every sample sharing `best` leading tokens with this one; its nearest is the first in input order
    // (one equal to it first, when it ends at `best`).
    const peers: number[] = [];
    for (let lo = r - 1; lo >= 0 && lcpNext[lo]! >= best; lo--) peers.push(order[lo]!);
    for (let hi = r; hi < lcpNext.length && lcpNext[hi]! >= best; hi++) peers.push(order[hi + 1]!);
    peers.sort((x, y) => x - y);
    const len = s.ids.length;
    const nearest = (best === len ? peers.find((p) => samples[p]!.ids.length === len) : undefined) ?? peers[0]!;
    const other = samples[nearest]!;
    const kind = best === len ? (other.ids.length === len ? "identical" : "ended") : "token";
    return { key: s.key, at: best, kind, nearest: other.key, length: len };
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
