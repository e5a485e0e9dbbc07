/** Hash slots in a Redis Cluster (keys map to `CRC16(key) mod 16384`). */
export const SLOTS = 16384;

const TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

/**
 * CRC16-XMODEM (poly 0x1021, init 0) of the UTF-8 bytes of `s`: the checksum
 * Redis Cluster hashes keys with (Python: `binascii.crc_hqx(b, 0)`).
 * @see https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#key-distribution-model
 */
export function crc16(s: string | Uint8Array): number {
  const bytes = typeof s === "string" ? new TextEncoder().encode(s) : s;
  let crc = 0;
  for (const b of bytes) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ b) & 0xff]!;
  return crc;
}

/**
 * The hash slot of a key, as `CLUSTER KEYSLOT` answers: the CRC16 of the
 * key's hash tag — the text between its first `{` and the first `}` after
 * it, when that is not empty — else of the whole key, mod 16384.
 */
export function keySlot(key: string | Uint8Array): number {
  const bytes = typeof key === "string" ? new TextEncoder().encode(key) : key;
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) return crc16(bytes.subarray(open + 1, close)) % SLOTS;
  }
  return crc16(bytes) % SLOTS;
}

/**
 * Which of `shards` stream shards a group belongs to: `CRC16(uid) mod
 * shards` over the uid's UTF-8 bytes (the raw uid, before key encoding).
 * Always 0 for one shard.
 */
export function shardOf(uid: string, shards: number): number {
  return shards <= 1 ? 0 : crc16(uid) % shards;
}

const tagCache = new Map<number, readonly string[]>();

/**
 * The hash tags (text inside `{…}`) of the `shards` stream shards: shard
 * `k`'s tag is the first of `s{k}`, `s{k}.1`, `s{k}.2`, … whose slot lies
 * in the middle half of the k-th of `shards` equal slot ranges
 * (`[k·16384/shards, (k+1)·16384/shards)`), so the shards spread evenly
 * over the slot space and, on a cluster whose masters own equal contiguous
 * ranges (what `redis-cli --cluster create` makes), land on different
 * masters when `shards` is a multiple of the master count. Deterministic:
 * every writer and reader (TypeScript and Python) derives the same tags.
 * @throws RangeError when `shards` is not an integer in 1…1024.
 */
export function shardTags(shards: number): readonly string[] {
  if (!Number.isInteger(shards) || shards < 1 || shards > 1024) throw new RangeError(`shards must be an integer in 1..1024, got ${shards}`);
  const hit = tagCache.get(shards);
  if (hit) return hit;
  const tags: string[] = [];
  for (let k = 0; k < shards; k++) {
    const lo = (k * SLOTS) / shards;
    const w = SLOTS / shards;
    for (let j = 0; ; j++) {
      const tag = j === 0 ? `s${k}` : `s${k}.${j}`;
      const slot = crc16(tag) % SLOTS;
      if (slot >= lo + w / 4 && slot < lo + (3 * w) / 4) {
        tags.push(tag);
        break;
      }
    }
  }
  tagCache.set(shards, tags);
  return tags;
}
