import { hashInt } from "../../shared/inference/hash.ts";

/** Default prefix-cache capacity: 16,384 blocks of 16 tokens (262,144 tokens per replica). */
export const DEFAULT_KV_CACHE_BLOCKS = 16_384;
/** vLLM's default KV block size in tokens. */
export const DEFAULT_BLOCK_SIZE = 16;

/**
 * A model of an engine's automatic prefix cache: an LRU over full blocks of
 * `blockSize` tokens, each keyed by a hash of the whole prefix up to and
 * including it (so a block only hits when everything before it matches).
 * A hit never covers the last prompt token, which must be computed to sample.
 * Blocks of a looked-up prefix are refreshed tail first, so eviction takes a
 * sequence's tail before its head, as vLLM's free-block queue does.
 * @see vLLM automatic prefix caching (`kv_cache_utils.hash_block_tokens`)
 */
export class PrefixKvCache {
  readonly capacityBlocks: number;
  readonly blockSize: number;
  private readonly blocks = new Map<string, true>();

  constructor(opts: { capacityBlocks?: number; blockSize?: number } = {}) {
    this.capacityBlocks = opts.capacityBlocks ?? DEFAULT_KV_CACHE_BLOCKS;
    this.blockSize = opts.blockSize ?? DEFAULT_BLOCK_SIZE;
    if (!(this.capacityBlocks >= 0) || !(this.blockSize >= 1)) throw new RangeError("capacityBlocks must be ≥ 0 and blockSize ≥ 1");
  }

  /** Number of prompt tokens already cached (a multiple of `blockSize`, < `ids.length`); refreshes the hit blocks. */
  lookup(ids: readonly number[]): number {
    const keys = this.blockKeys(ids, Math.max(0, ids.length - 1));
    let hit = 0;
    while (hit < keys.length && this.blocks.has(keys[hit])) hit++;
    for (let i = hit - 1; i >= 0; i--) this.touch(keys[i]);
    return hit * this.blockSize;
  }

  /** Caches every full block of `ids` (prompt ‖ generated), evicting least-recently-used blocks. */
  insert(ids: readonly number[]): void {
    if (this.capacityBlocks === 0) return;
    const keys = this.blockKeys(ids, ids.length);
    for (let i = keys.length - 1; i >= 0; i--) this.touch(keys[i]);
    while (this.blocks.size > this.capacityBlocks) {
      const oldest = this.blocks.keys().next().value as string;
      this.blocks.delete(oldest);
    }
  }

  /** Blocks currently held. */
  get size(): number {
    return this.blocks.size;
  }

  /** Drops everything (`/reset_prefix_cache`, `/flush_cache`). */
  clear(): void {
    this.blocks.clear();
  }

  private touch(key: string): void {
    this.blocks.delete(key);
    this.blocks.set(key, true);
  }

  /** Chained 64-bit (two 32-bit lanes) hashes of the full blocks within the first `limit` ids. */
  private blockKeys(ids: readonly number[], limit: number): string[] {
    const n = Math.floor(limit / this.blockSize);
    const keys: string[] = new Array(n);
    let a = 0x9747b28c;
    let b = 0x2545f491;
    for (let blk = 0; blk < n; blk++) {
      const base = blk * this.blockSize;
      for (let j = 0; j < this.blockSize; j++) {
        a = hashInt(a, ids[base + j]);
        b = hashInt(b ^ 0x5bd1e995, ids[base + j] + 0x9e3779b9);
      }
      keys[blk] = `${a.toString(36)}.${b.toString(36)}`;
    }
    return keys;
  }
}
