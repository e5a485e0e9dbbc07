/**
 * Model, tool and prompt text made safe to print: the characters a terminal
 * would act on instead of showing — C0 controls but newline and tab (ESC
 * starts CSI/OSC sequences: clear screen, window title, OSC 52 clipboard
 * writes), DEL, C1 controls (U+0080–U+009F: 8-bit CSI/OSC), and the bidi
 * controls that reorder what is shown (U+061C, U+200E, U+200F, U+202A–U+202E,
 * U+2066–U+2069) — are written as visible escapes (`\x1b`, `\u202e`).
 * Linear in the text (one pass over its code units). Newlines and tabs
 * stay, so the layout of a turn reads as it was sampled; with
 * `newlines: false` they are escaped too (`\n`, `\t`), for one-line output.
 */
export function terminalSafe(text: string, opts: { newlines?: boolean } = {}): string {
  const keep = opts.newlines !== false;
  const parts: string[] = [];
  let from = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (!isUnsafe(c, keep)) continue;
    if (i > from) parts.push(text.slice(from, i));
    parts.push(escapeCode(c));
    from = i + 1;
  }
  if (from === 0) return text;
  if (from < text.length) parts.push(text.slice(from));
  return parts.join("");
}

function isUnsafe(c: number, keepNewlines: boolean): boolean {
  if (c < 0x20) return !(keepNewlines && (c === 10 || c === 9));
  if (c < 0x7f) return false;
  if (c <= 0x9f) return true;
  if (c < 0x61c) return false;
  return c === 0x61c || c === 0x200e || c === 0x200f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

function escapeCode(code: number): string {
  if (code === 10) return "\\n";
  if (code === 9) return "\\t";
  if (code === 13) return "\\r";
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
}

/**
 * JSON text (from `JSON.stringify`) with the C1 and bidi controls that
 * `JSON.stringify` leaves raw written as `\uXXXX` escapes: the same JSON
 * value, safe on a terminal (C0 controls are already escaped by JSON).
 */
export function terminalSafeJson(json: string): string {
  return json.replace(JSON_UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

const JSON_UNSAFE = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
