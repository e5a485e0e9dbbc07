import type { Tokenizer } from "@huggingface/tokenizers";

/**
 * GPT-2's byte-level alphabet reversed: the UTF-16 code of the character that
 * stands for byte `b` → `b` (printable Latin-1 bytes stand for themselves, the
 * others for U+0100 + n in byte order). The same table as
 * `UNICODE_TO_BYTES` in `@huggingface/tokenizers` (src/static/constants.ts).
 */
const CHAR_TO_BYTE: ReadonlyMap<number, number> = (() => {
  const m = new Map<number, number>();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    m.set(printable ? b : 256 + n++, b);
  }
  return m;
})();

/** The library's internals this table reads (fields of `Tokenizer` in @huggingface/tokenizers 0.2.0). */
interface TokenizerInternals {
  model?: { vocab?: unknown; unk_token?: unknown } | null;
  decoder?: { end_of_word_suffix?: unknown; added_tokens?: unknown } | null;
  special_tokens?: unknown;
}

/**
 * A precomputed decode for tokenizers whose decoder is exactly `ByteLevel`
 * (Qwen3, Llama 3.1, DeepSeek V3, gpt-oss): per id, the bytes its vocabulary
 * piece stands for, or — for a piece equal to an added token's content — that
 * text verbatim, and whether `skip_special_tokens` drops it.
 *
 * {@link decode} returns exactly what `Tokenizer.decode(ids, {skip_special_tokens,
 * clean_up_tokenization_spaces: false})` of `@huggingface/tokenizers` returns,
 * following its code (0.2.0, `Tokenizer.decode` and `ByteLevelDecoder.decode_chain`):
 * - an id maps to `model.vocab[id]`, else (out of range, not an integer, a hole) to `model.unk_token`
 *   (none for these families: such an id contributes nothing);
 * - skipping drops every token whose text is in the library's special-token list (special added
 *   tokens plus `additional_special_tokens` of the config), before decoding, so bytes on either
 *   side of a dropped token join;
 * - a token whose text is an added token's content (special or not) is emitted verbatim and
 *   ends the byte run before it; each byte run is decoded alone as UTF-8 with a non-fatal,
 *   BOM-keeping `TextDecoder` (invalid or cut sequences become U+FFFD per the WHATWG decoder);
 * - a character outside the byte-level alphabet in a vocabulary piece counts as byte 0 (the
 *   library's `Uint8Array` of an undefined lookup).
 * The library scans every added token per token; this looks each id up once.
 */
export class ByteLevelDecodeTable {
  /** Bytes of every entry, back to back; entry `e` is `bytes[offsets[e] .. offsets[e + 1])`. */
  private readonly bytes: Uint8Array;
  private readonly offsets: Int32Array;
  /** Per entry: bit 0 = verbatim text ({@link texts}), bit 1 = dropped when skipping special tokens. */
  private readonly flags: Uint8Array;
  private readonly texts: Map<number, string>;
  /** Entries `0 .. size-1` are ids; entry `size` stands for every other id (the unknown token). */
  private readonly size: number;
  private readonly utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  private buf = new Uint8Array(4096);

  private constructor(bytes: Uint8Array, offsets: Int32Array, flags: Uint8Array, texts: Map<number, string>, size: number) {
    this.bytes = bytes;
    this.offsets = offsets;
    this.flags = flags;
    this.texts = texts;
    this.size = size;
  }

  /**
   * The table for `tok`, or undefined when the fast decode would not be exact:
   * the decoder config (`tokenizer.json`'s `decoder`) is not exactly
   * `{type: "ByteLevel", ...}`, the model has an end-of-word suffix, the
   * library's internals are not where 0.2.0 keeps them, or a vocabulary piece
   * holds a UTF-16 surrogate (two pieces could then join into one character).
   * Cost: one pass over the vocabulary (tens of ms for 128k ids).
   */
  static build(tok: Tokenizer, decoderConfig: unknown): ByteLevelDecodeTable | undefined {
    if (!decoderConfig || typeof decoderConfig !== "object" || (decoderConfig as { type?: unknown }).type !== "ByteLevel") return undefined;
    const t = tok as unknown as TokenizerInternals;
    const vocab = t.model?.vocab;
    const special = t.special_tokens;
    const added = t.decoder?.added_tokens;
    if (!Array.isArray(vocab) || !Array.isArray(special) || !Array.isArray(added) || t.decoder?.end_of_word_suffix) return undefined;
    const specialSet = new Set<unknown>(special);
    const addedSet = new Set<unknown>(added.map((a: { content?: unknown }) => a.content));
    const unk = t.model?.unk_token;
    const size = vocab.length;
    const offsets = new Int32Array(size + 2);
    const flags = new Uint8Array(size + 1);
    const texts = new Map<number, string>();
    let bytes = new Uint8Array(1 << 20);
    let len = 0;
    for (let e = 0; e <= size; e++) {
      offsets[e] = len;
      const piece: unknown = e < size ? (vocab[e] ?? unk) : unk;
      if (specialSet.has(piece)) flags[e] |= 2;
      if (addedSet.has(piece)) {
        flags[e] |= 1;
        texts.set(e, typeof piece === "string" ? piece : ""); // a non-string token joins as ""
        continue;
      }
      if (piece == null) continue; // joined as "": nothing
      if (typeof piece !== "string") return undefined;
      if (bytes.length - len < piece.length) {
        const grown = new Uint8Array(Math.max(bytes.length * 2, len + piece.length));
        grown.set(bytes.subarray(0, len));
        bytes = grown;
      }
      for (let i = 0; i < piece.length; i++) {
        const c = piece.charCodeAt(i);
        if (c >= 0xd800 && c <= 0xdfff) return undefined;
        bytes[len++] = CHAR_TO_BYTE.get(c) ?? 0;
      }
    }
    offsets[size + 1] = len;
    return new ByteLevelDecodeTable(bytes.slice(0, len), offsets, flags, texts, size);
  }

  /**
   * Text of `ids`, as the library decodes it (see the class doc). Returns
   * undefined, to send the caller to the library, when `ids` is empty or holds
   * a value that is not a number or the first id is not an integer (the
   * library throws or converts those).
   */
  decode(ids: ArrayLike<number>, skipSpecialTokens: boolean): string | undefined {
    const n = ids.length;
    if (n === 0 || !Number.isInteger(ids[0])) return undefined;
    const { bytes, offsets, flags, size } = this;
    let buf = this.buf;
    let len = 0;
    let out = "";
    for (let i = 0; i < n; i++) {
      const id = ids[i];
      if (typeof id !== "number") return undefined;
      const e = Number.isInteger(id) && id >= 0 && id < size ? id : size;
      const f = flags[e]!;
      if (skipSpecialTokens && f & 2) continue;
      if (f & 1) {
        if (len > 0) {
          out += this.utf8.decode(buf.subarray(0, len));
          len = 0;
        }
        out += this.texts.get(e)!;
        continue;
      }
      const a = offsets[e]!;
      const b = offsets[e + 1]!;
      if (len + (b - a) > buf.length) {
        const grown = new Uint8Array(Math.max(buf.length * 2, len + (b - a)));
        grown.set(buf.subarray(0, len));
        this.buf = buf = grown;
      }
      for (let k = a; k < b; k++) buf[len++] = bytes[k]!;
    }
    if (len > 0) out += this.utf8.decode(buf.subarray(0, len));
    return out;
  }
}
