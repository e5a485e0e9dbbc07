/**
 * A plain array holding `values` in order (token ids, mask entries,
 * log-probs), for the JSON boundary. The same values as `Array.from(values)`
 * — a float32 entry becomes the same double — but an indexed loop: Bun's
 * `Array.from` takes the iterator path for typed arrays, ~10× slower (18 µs
 * for 400 ids, against 1.6 µs).
 */
export function toPlainArray(values: ArrayLike<number>): number[] {
  const n = values.length;
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = values[i]!;
  return out;
}

/**
 * `values` itself when it is already a plain array (nothing to copy for a
 * JSON body the caller builds and drops), else {@link toPlainArray}.
 */
export function asPlainArray(values: ArrayLike<number>): number[] {
  return Array.isArray(values) ? (values as number[]) : toPlainArray(values);
}
