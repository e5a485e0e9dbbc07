/**
 * Index of the first `close` at or after `start` that lies outside JSON
 * strings, so a delimiter inside an argument value (`"</tool_call>"`,
 * `"<|call|>"`) does not end the call. When quotes never balance (the body is
 * not JSON) the first plain `close` is returned; -1 when there is none.
 * Used by every JSON-bodied parser (hermes, llama3_json, deepseek_v3).
 */
export function indexOutsideJsonStrings(text: string, close: string, start: number): number {
  return firstOutsideJsonStrings(text, [close], start).at;
}

/** Earliest of several delimiters outside JSON strings: its index and which one, or index -1. */
export function firstOutsideJsonStrings(text: string, closes: readonly string[], start: number): { at: number; close?: string } {
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else {
      for (const close of closes) if (close.charCodeAt(0) === c && text.startsWith(close, i)) return { at: i, close };
    }
  }
  // Quotes balanced and no delimiter outside them: there is none (one inside a string is data). Only text
  // whose quotes never balance (not JSON) falls back to the first plain delimiter.
  if (!inString) return { at: -1 };
  let best = -1;
  let which: string | undefined;
  for (const close of closes) {
    const k = text.indexOf(close, start);
    if (k >= 0 && (best < 0 || k < best)) {
      best = k;
      which = close;
    }
  }
  return { at: best, close: which };
}

/** A plain JSON object or not. */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

const NAME_RE = /"name"\s*:\s*"((?:[^"\\]|\\.)*)"/;

/** Best-effort tool name of a malformed JSON call body (`"name": "…"`), for error messages. */
export function recoverName(body: string): string | undefined {
  const m = NAME_RE.exec(body);
  if (!m) return undefined;
  try {
    return JSON.parse(`"${m[1]}"`) as string;
  } catch {
    return m[1];
  }
}

/**
 * The arguments value of a JSON call object: `arguments`, or `parameters`
 * (SGLang's `BaseFormatDetector.parse_base_json` reads either; llama3_json
 * uses `parameters`). Both present with different values is an error message
 * (the engines disagree on which wins), returned as `{ error }`.
 * @see SGLang `BaseFormatDetector.parse_base_json` (`python/sglang/srt/function_call/base_format_detector.py`)
 */
export function callArgumentsValue(v: Record<string, unknown>): { value: unknown } | { error: string } {
  const hasArgs = Object.hasOwn(v, "arguments");
  const hasParams = Object.hasOwn(v, "parameters");
  if (hasArgs && hasParams && JSON.stringify(v.arguments) !== JSON.stringify(v.parameters)) {
    return { error: `both "arguments" and "parameters" are given with different values; give the arguments once` };
  }
  return { value: hasArgs ? v.arguments : v.parameters };
}
