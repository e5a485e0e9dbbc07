import type { ToolSchema } from "../schema/index.ts";
import type { MessageShaping, TemplateMessage } from "../tokens/model-traits.ts";

/**
 * Gemma 3's stock template knows only `system` (folded into the first user
 * turn), `user` and `assistant` (rendered `model`), strictly alternating, and
 * renders neither tools nor tool calls. edgeloop keeps the stock template and
 * shapes the messages it sees, following Google's Gemma function-calling
 * guide (functions described in the prompt, calls written as Python, results
 * sent back in a user turn):
 * - tools: a system block listing them as JSON and asking for calls in the
 *   pythonic form `[name(arg=value, …)]` (merged with the conversation's own
 *   system message, which the template puts into the first user turn);
 * - an assistant turn's tool calls: appended to its text as `[f(a=1), g(b="x")]`
 *   (the form the `pythonic` parser reads);
 * - a run of tool results: ONE user turn, each result in a
 *   ```` ```tool_output ```` block, in order, so roles still alternate.
 * @see https://ai.google.dev/gemma/docs/capabilities/function-calling
 */
export const gemma3Shaping: MessageShaping = {
  prepare: shapeGemma3,
};

/** The tools preamble (exported for tests). */
export function gemma3ToolsPreamble(tools: readonly ToolSchema[]): string {
  return (
    "You have access to functions. If you decide to invoke any of the function(s), you MUST put it in the format of\n" +
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n" +
    "You SHOULD NOT include any other text in the response if you call a function\n" +
    tools.map((t) => JSON.stringify(t)).join("\n")
  );
}

function shapeGemma3(messages: TemplateMessage[], tools: readonly ToolSchema[] | undefined): TemplateMessage[] {
  const out: TemplateMessage[] = [];
  let results: string[] = [];
  const flush = () => {
    if (results.length > 0) out.push({ role: "user", content: results.join("\n") });
    results = [];
  };
  for (const m of messages) {
    if (m.role === "tool") {
      results.push("```tool_output\n" + String(m.content ?? "") + "\n```");
      continue;
    }
    flush();
    if (m.role === "assistant" && Array.isArray(m.tool_calls) && m.tool_calls.length > 0) {
      const calls = (m.tool_calls as { function: { name: string; arguments: unknown } }[]).map((c) => pythonicCall(c.function.name, c.function.arguments));
      const text = String(m.content ?? "");
      out.push({ role: "assistant", content: (text ? text + "\n" : "") + "[" + calls.join(", ") + "]" });
      continue;
    }
    out.push(m);
  }
  flush();
  if (tools && tools.length > 0) {
    const preamble = gemma3ToolsPreamble(tools);
    if (out[0]?.role === "system") out[0] = { ...out[0], content: String(out[0].content ?? "") + "\n\n" + preamble };
    else out.unshift({ role: "system", content: preamble });
  }
  return out;
}

/** `name(k=v, …)` with Python literals; non-object arguments are passed as one positional literal. */
export function pythonicCall(name: string, args: unknown): string {
  if (args !== null && typeof args === "object" && !Array.isArray(args)) {
    return `${name}(${Object.entries(args as Record<string, unknown>).map(([k, v]) => `${k}=${pyLiteral(v)}`).join(", ")})`;
  }
  return `${name}(${pyLiteral(args)})`;
}

/** A JSON value as a Python literal (`True`, `None`, double-quoted strings). */
export function pyLiteral(v: unknown): string {
  if (v === null || v === undefined) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number") return Number.isFinite(v) ? String(v) : "None";
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(pyLiteral).join(", ") + "]";
  return "{" + Object.entries(v as Record<string, unknown>).map(([k, x]) => `${JSON.stringify(k)}: ${pyLiteral(x)}`).join(", ") + "}";
}
