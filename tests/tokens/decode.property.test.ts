import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { Tokenizer } from "@huggingface/tokenizers";
import { builtinModelFiles } from "../../shared/models/builtin-families.ts";
import { ByteLevelDecodeTable } from "../../shared/tokens/byte-level-decode.ts";
import { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Property: ChatTokenizer.decode (the byte-level table) returns exactly what
// @huggingface/tokenizers' decode returns (clean_up_tokenization_spaces false),
// with and without skipping special tokens, for random id lists (special and
// added ids, single-byte pieces that cut UTF-8 characters, ids out of range)
// and for the encodings of random Unicode text and their slices.

const FAMILIES = ["qwen3", "llama3_1", "deepseek_v3", "gpt_oss"] as const;

interface Fam {
  tok: ChatTokenizer;
  /** Ids 0 .. size-1 have a piece. */
  size: number;
  addedIds: number[];
  /** Ids whose piece is one byte 0x80..0xFF (a lead or continuation byte alone). */
  highByteIds: number[];
}

const fams = new Map<string, Fam>();
beforeAll(async () => {
  for (const name of FAMILIES) {
    const files = await builtinModelFiles(name);
    const tok = new ChatTokenizer(files);
    const t = files.tokenizer as { model: { vocab: Record<string, number> }; added_tokens: { id: number }[] };
    const addedIds = t.added_tokens.map((a) => a.id);
    const size = Math.max(...Object.values(t.model.vocab), ...addedIds) + 1;
    const highByteIds: number[] = [];
    // GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest for U+0100 + n.
    let n = 0;
    for (let b = 0; b < 256; b++) {
      const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      const ch = String.fromCharCode(printable ? b : 256 + n++);
      const id = t.model.vocab[ch];
      if (b >= 0x80 && id !== undefined) highByteIds.push(id);
    }
    expect(highByteIds.length).toBe(128);
    fams.set(name, { tok, size, addedIds, highByteIds });
  }
}, HANG_MS);

function lib(tok: ChatTokenizer, ids: number[], skip: boolean): string {
  return tok.libraryDecode(ids, { skipSpecialTokens: skip });
}

function same(f: Fam, ids: number[]): void {
  for (const skip of [false, true]) {
    expect(f.tok.decode(ids, { skipSpecialTokens: skip })).toBe(lib(f.tok, ids, skip));
  }
}

describe.each(FAMILIES)("byte-level decode of %s", (name) => {
  test("the fast table is used (decoder is exactly ByteLevel)", async () => {
    const files = await builtinModelFiles(name);
    const table = ByteLevelDecodeTable.build(new Tokenizer(files.tokenizer as object, files.tokenizerConfig), (files.tokenizer as { decoder: unknown }).decoder);
    expect(table).toBeDefined();
  });

  test("random id lists: specials, cut characters, out of range", () => {
    const f = fams.get(name)!;
    const id = fc.oneof(
      { weight: 4, arbitrary: fc.integer({ min: 0, max: f.size - 1 }) },
      { weight: 3, arbitrary: fc.constantFrom(...f.addedIds) },
      { weight: 4, arbitrary: fc.constantFrom(...f.highByteIds) },
      { weight: 1, arbitrary: fc.constantFrom(-1, f.size, f.size + 7, 1e9, 2.5, -0, Number.NaN, Infinity) },
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: f.size - 1 }), fc.array(id, { maxLength: 60 }), (first, rest) => same(f, [first, ...rest])),
      { numRuns: 400 },
    );
  });

  test("encodings of random Unicode text, whole and sliced", () => {
    const f = fams.get(name)!;
    const special = f.addedIds.map((i) => f.tok.libraryDecode([i]));
    const piece = fc.oneof(
      { weight: 5, arbitrary: fc.string({ unit: "binary", maxLength: 30 }) },
      { weight: 2, arbitrary: fc.string({ unit: "grapheme", maxLength: 10 }) },
      { weight: 1, arbitrary: fc.constantFrom(...special) },
    );
    fc.assert(
      fc.property(fc.array(piece, { minLength: 1, maxLength: 6 }), fc.nat(), fc.nat(), (parts, a, b) => {
        const ids = f.tok.encode(parts.join(""));
        if (ids.length === 0) return;
        same(f, ids);
        const lo = a % ids.length;
        const hi = lo + 1 + (b % (ids.length - lo));
        same(f, ids.slice(lo, hi));
      }),
      { numRuns: 300 },
    );
  });

  test("a first id that is not an integer throws the library's error", () => {
    const f = fams.get(name)!;
    expect(() => f.tok.decode([1.5, 3])).toThrow("token_ids must be a non-empty array of integers.");
    expect(f.tok.decode([])).toBe("");
  });
});

describe("exact values (Qwen3)", () => {
  test("a character cut by a skipped special token joins; a cut by a kept one is replaced", () => {
    const f = fams.get("qwen3")!;
    const rare = "\u{F0000}"; // private use, 4 UTF-8 bytes: F3 B0 80 80
    const euro = f.tok.encode(rare);
    expect(euro.length).toBeGreaterThan(1);
    const imEnd = 151645;
    const ids = f.tok.encode(`a${rare}b`);
    expect(f.tok.decode(ids)).toBe(`a${rare}b`);
    const cut = [...euro.slice(0, 1), imEnd, ...euro.slice(1)];
    expect(f.tok.decode(cut, { skipSpecialTokens: true })).toBe(rare);
    expect(f.tok.decode(cut)).toBe(f.tok.libraryDecode(cut));
    expect(f.tok.decode(cut)).toContain("\uFFFD<|im_end|>");
  });

  test("an id past the vocabulary contributes nothing", () => {
    const f = fams.get("qwen3")!;
    const hi = f.tok.encode("hi");
    expect(f.tok.decode([...hi, 10_000_000, ...hi])).toBe("hihi");
    expect(f.tok.libraryDecode([...hi, 10_000_000, ...hi])).toBe("hihi");
  });
});

test("gemma3's Sequence decoder gets no table (library decode)", async () => {
  const files = await builtinModelFiles("gemma3");
  expect(ByteLevelDecodeTable.build(new Tokenizer(files.tokenizer as object, files.tokenizerConfig), (files.tokenizer as { decoder: unknown }).decoder)).toBeUndefined();
}, HANG_MS);
