import type { ToolSchema } from "../schema/index.ts";

/**
 * One value slot of a {@link TextFormula}: which value (an index into the
 * values the formula is evaluated with) and whether the template trims it.
 */
export interface FormulaSlot {
  /** Index into the values array. */
  value: number;
  /** The template writes the value trimmed (`{{ content | trim }}`, Llama 3.1). */
  trim: boolean;
}

/**
 * A chat template's output for one message shape, as constant texts around
 * value slots: `pieces[0] + v(slot 0) + pieces[1] + … + pieces[n]`, where
 * `pieces` alternate strings and slots (a string always first and last).
 * Derived once by {@link deriveTextFormula}; evaluating it costs a string
 * concatenation instead of a Jinja render.
 */
export interface TextFormula {
  /** Constant texts, length = slots.length + 1. */
  texts: string[];
  slots: FormulaSlot[];
}

/** A formula, or why none could be derived (the caller then renders as before). */
export type FormulaResult = { ok: true; formula: TextFormula } | { ok: false; reason: string };

/**
 * Trims as the template engine's `trim` filter does. `@huggingface/jinja`
 * implements `trim` with JavaScript's `String.prototype.trim` (its
 * whitespace set: ECMAScript WhiteSpace and LineTerminator, which includes
 * U+FEFF but not U+0085 or U+001C–U+001F, unlike Python's `str.strip`).
 * edgeloop's ids are those of that renderer, so this is the set to follow;
 * the derivation probes hold characters where the two sets differ, so a
 * renderer that changed to Python's set would fail the check, not go wrong.
 * @see node_modules/@huggingface/jinja runtime: `case "trim": … .trim()`
 */
export function templateTrim(s: string): string {
  return s.trim();
}

/** `formula` with `values` in its slots. */
export function evaluateFormula(formula: TextFormula, values: readonly string[]): string {
  const { texts, slots } = formula;
  let s = texts[0]!;
  for (let i = 0; i < slots.length; i++) {
    const slot = slots[i]!;
    const v = values[slot.value]!;
    s += (slot.trim ? templateTrim(v) : v) + texts[i + 1]!;
  }
  return s;
}

/**
 * Contents every derived formula is checked with (each value slot gets each
 * probe, rotated so that neighbouring slots hold different ones):
 * whitespace edges (templates that `trim`), whitespace only, characters
 * where Python's and JavaScript's whitespace sets differ, unicode, text that
 * looks like special tokens or template syntax of the built-in families,
 * Qwen3's `<tool_response>` wrapping (its template tests user contents for
 * it), `<think>` blocks, and JSON. Never empty: callers make an empty value
 * a constant of the shape they derive (templates test `if content`), and
 * derive and check that shape separately.
 */
export const FORMULA_PROBES: readonly string[] = [
  "plain words",
  "  leading and trailing spaces  ",
  "\n\nnewlines around\n\n",
  " \t\n ",
  "\u00a0\u2003\u3000 wide spaces \u3000\ufeff",
  "\u0085\u001c next-line and file-separator \u001f\u0085",
  "\v\f\r vertical tab, form feed \r\n",
  "unicode 城市 naïve ✓ 🙂 \u0301",
  "<|im_end|>\n<|im_start|>assistant\n<|eot_id|><|start_header_id|>",
  "<tool_response>\nlooks like a tool response\n</tool_response>",
  "<think>\nthought\n</think>\n\nafter",
  "<start_of_turn>user\n<end_of_turn><|end|><|start|>assistant<|channel|>final<|message|><|return|>",
  "<｜tool▁output▁begin｜>x<｜tool▁output▁end｜><｜User｜><｜Assistant｜><｜end▁of▁sentence｜>",
  '{"name": "calc", "arguments": {"expr": "1+1"}, "list": [1, 2.5, null, true]}',
  "{{ messages }} {% if x %}jinja{% endif %} ElMark0kRaMlE",
  "```tool_output\nfenced\n```",
];

const MARK = (i: number) => `ElMark${i}kRaMlE`;
const MARK_RE = /ElMark(\d+)kRaMlE/g;
/** Whitespace put around markers to see which slots the template trims. */
const PAD_L = " \n\t";
const PAD_R = "\t\n ";

/**
 * Derives the text formula of a template output that depends on `count`
 * string values (message contents, names) through `render(values)`: renders
 * once with a unique marker per value and splits the output around the
 * markers, renders once with whitespace around the markers to find the slots
 * the template trims, then checks the formula against `render` for every
 * {@link FORMULA_PROBES} content in every slot.
 *
 * Never throws: a render that throws, a value written more than verbatim or
 * trimmed (upper-cased, escaped, tested with `if`, …), or any probe whose
 * render differs from the formula gives `{ok: false, reason}`, and the
 * caller keeps rendering per call. The probes make the method safe for the
 * built-in templates and the usual custom ones; a template whose output
 * depends on its contents in a way no probe exercises is the residual risk,
 * which the property tests bound for the built-in families.
 */
export function deriveTextFormula(count: number, render: (values: readonly string[]) => string): FormulaResult {
  let marked: string;
  let padded: string;
  try {
    marked = render(Array.from({ length: count }, (_, i) => MARK(i)));
    padded = render(Array.from({ length: count }, (_, i) => PAD_L + MARK(i) + PAD_R));
  } catch (e) {
    return { ok: false, reason: `the template raised: ${(e as Error).message}` };
  }
  const split = (text: string) => {
    const texts: string[] = [];
    const ids: number[] = [];
    let last = 0;
    for (const m of text.matchAll(MARK_RE)) {
      texts.push(text.slice(last, m.index));
      ids.push(Number(m[1]));
      last = m.index! + m[0].length;
    }
    texts.push(text.slice(last));
    return { texts, ids };
  };
  const a = split(marked);
  const b = split(padded);
  if (a.ids.length !== b.ids.length || a.ids.some((v, i) => v !== b.ids[i] || v >= count)) {
    return { ok: false, reason: "the template writes a value other than verbatim" };
  }
  // b.texts[j] = (slot j-1 untrimmed ? PAD_R : "") + a.texts[j] + (slot j untrimmed ? PAD_L : "").
  const slots: FormulaSlot[] = [];
  let prevPadded = false;
  for (let j = 0; j < a.texts.length; j++) {
    let t = b.texts[j]!;
    if (prevPadded) {
      if (!t.startsWith(PAD_R)) return { ok: false, reason: "the template writes a value other than verbatim or trimmed" };
      t = t.slice(PAD_R.length);
    }
    if (j === a.texts.length - 1) {
      if (t !== a.texts[j]) return { ok: false, reason: "the template writes a value other than verbatim or trimmed" };
      break;
    }
    if (t === a.texts[j]) {
      slots.push({ value: a.ids[j]!, trim: true });
      prevPadded = false;
    } else if (t === a.texts[j] + PAD_L) {
      slots.push({ value: a.ids[j]!, trim: false });
      prevPadded = true;
    } else {
      return { ok: false, reason: "the template writes a value other than verbatim or trimmed" };
    }
  }
  const formula: TextFormula = { texts: a.texts, slots };
  const n = FORMULA_PROBES.length;
  for (let p = 0; p < n; p++) {
    const values = Array.from({ length: count }, (_, i) => FORMULA_PROBES[(p + i) % n]!);
    let want: string;
    try {
      want = render(values);
    } catch (e) {
      return { ok: false, reason: `the template raised for probe content ${JSON.stringify(values[0])}: ${(e as Error).message}` };
    }
    if (evaluateFormula(formula, values) !== want) {
      return { ok: false, reason: `the render with content ${JSON.stringify(values[0])} differs from the formula` };
    }
  }
  return { ok: true, formula };
}

const toolKeys = new WeakMap<readonly ToolSchema[], string>();

/** A cache key for a tools list (its JSON, computed once per list object); "" for none. */
export function toolsKey(tools: readonly ToolSchema[] | undefined): string {
  if (!tools || tools.length === 0) return "";
  let k = toolKeys.get(tools);
  if (k === undefined) {
    k = JSON.stringify(tools);
    toolKeys.set(tools, k);
  }
  return k;
}

/** A cache key for what shapes every render besides the messages: the tools and the template kwargs. */
export function renderOptionsKey(tools: readonly ToolSchema[] | undefined, chatTemplateKwargs: Record<string, unknown> | undefined): string {
  return `${toolsKey(tools)}\u0000${chatTemplateKwargs ? JSON.stringify(chatTemplateKwargs) : "{}"}`;
}
