/**
 * Model, tool and prompt text made safe to print: the characters a terminal
 * would act on instead of showing — C0 controls but newline and tab (ESC
 * starts CSI/OSC sequences: clear screen, window title, OSC 52 clipboard
 * writes), DEL, C1 controls (U+0080–U+009F: 8-bit CSI/OSC), and the bidi
 * controls that reorder what is shown (U+061C, U+200E, U+200F, U+202A–U+202E,
 * U+2066–U+2069) — are written as visible escapes (`\x1b`, `\u202e`).
 * Linear in the text (one regex over a character class). Newlines and tabs
 * stay, so the layout of a turn reads as it was sampled; with
 * `newlines: false` they are escaped too (`\n`, `\t`), for one-line output.
 */
export function terminalSafe(text: string, opts: { newlines?: boolean } = {}): string {
  return text.replace(opts.newlines === false ? UNSAFE_ONE_LINE : UNSAFE, escapeChar);
}

const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const UNSAFE_ONE_LINE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function escapeChar(c: string): string {
  const code = c.charCodeAt(0);
  if (c === "\n") return "\\n";
  if (c === "\t") return "\\t";
  if (c === "\r") return "\\r";
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
