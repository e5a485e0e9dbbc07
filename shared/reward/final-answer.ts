const NUMBER_RE = /-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\$?\.\d+/g;

/**
 * Parses a number as people write answers: `1,000`, `-3.5`, `$12`, `-$4`,
 * `.5`, `7.`, surrounding spaces. Commas must group thousands. Returns null
 * for anything else.
 */
export function parseAnswerNumber(s: string): number | null {
  let t = s.trim().replace(/\.$/, "");
  let neg = false;
  if (t.startsWith("-")) {
    neg = true;
    t = t.slice(1).trim();
  }
  if (t.startsWith("$")) t = t.slice(1).trim();
  if (!neg && t.startsWith("-")) {
    neg = true;
    t = t.slice(1).trim();
  }
  if (!/^(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$/.test(t) || t === "" || t === ".") return null;
  const v = Number(t.replace(/,/g, ""));
  if (!Number.isFinite(v)) return null;
  return neg ? -v : v;
}

/** The text after the last `</think>` (the answer part of a reasoning turn), or the whole text. */
export function answerPart(text: string): string {
  const k = text.lastIndexOf("</think>");
  return k >= 0 ? text.slice(k + "</think>".length) : text;
}

/**
 * The final answer of an assistant turn, GSM8K style: the number after the
 * last `####` when there is one, otherwise the last number in the text
 * (reasoning before `</think>` ignored). Commas, a `$` and a minus sign are
 * understood. Returns the number's text as written (without `$`), or null.
 * @see verl `gsm8k.extract_solution` ("strict" uses `####`, "flexible" the last number)
 */
export function extractFinalAnswer(text: string): string | null {
  const t = answerPart(text);
  const hash = t.lastIndexOf("####");
  if (hash >= 0) {
    const m = t.slice(hash + 4).match(NUMBER_RE);
    if (m) return clean(m[0]);
  }
  const all = t.match(NUMBER_RE);
  return all ? clean(all[all.length - 1]!) : null;
}

function clean(s: string): string {
  return s.replace(/\$/g, "").replace(/\s/g, "");
}
