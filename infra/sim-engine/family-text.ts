import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { pythonicCall } from "../../shared/models/gemma3-messages.ts";

/**
 * A scripted policy's text turns are written once, in Qwen3's format
 * (`<think>…</think>` reasoning, Hermes `<tool_call>{"name": …, "arguments": …}</tool_call>`
 * blocks). The simulated engine samples them in the chosen model family's
 * own format, so the same example runs for every family:
 * - `qwen3` and model directories: unchanged;
 * - `llama3_1`: `{"name": N, "parameters": ARGS}` objects joined by `; `;
 * - `deepseek_v3`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
 * - `gemma3`: `[N(k=v, …)]`.
 * Families without a reasoning format (all three) drop the `<think>` block.
 * A call whose arguments are not valid JSON keeps its arguments text
 * verbatim in the family's shape, so malformed-call cases stay malformed.
 */
export function familyText(tok: ChatTokenizer, text: string): string {
  const family = tok.traits.family;
  if (family !== "llama3_1" && family !== "deepseek_v3" && family !== "gemma3") return text;
  let rest = text.replace(/<think>[\s\S]*?<\/think>\s*/g, "");
  const calls: { name: string; args: string; parsed?: Record<string, unknown> }[] = [];
  rest = rest.replace(/\s*<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, (_m, body: string) => {
    const m = /^\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*([\s\S]*)\}$/.exec(body.trim());
    if (!m) {
      calls.push({ name: "", args: body });
      return "";
    }
    const name = JSON.parse(m[1]!) as string;
    const args = m[2]!.trim();
    let parsed: Record<string, unknown> | undefined;
    try {
      const v = JSON.parse(args);
      if (v && typeof v === "object" && !Array.isArray(v)) parsed = v;
    } catch {
      parsed = undefined;
    }
    calls.push({ name, args, parsed });
    return "";
  });
  const content = rest.trim();
  if (calls.length === 0) return content;
  const prefix = content ? content + (family === "deepseek_v3" ? "" : "\n") : "";
  switch (family) {
    case "llama3_1":
      return prefix + calls.map((c) => (c.name ? `{"name": ${JSON.stringify(c.name)}, "parameters": ${c.args}}` : c.args)).join("; ");
    case "deepseek_v3":
      return (
        prefix +
        "<｜tool▁calls▁begin｜>" +
        calls.map((c) => `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${c.name}\n\`\`\`json\n${c.parsed ? JSON.stringify(c.parsed) : c.args}\n\`\`\`<｜tool▁call▁end｜>`).join("\n") +
        "<｜tool▁calls▁end｜>"
      );
    default:
      return prefix + "[" + calls.map((c) => (c.parsed ? pythonicCall(c.name, c.parsed) : `${c.name}(${c.args})`)).join(", ") + "]";
  }
}

/**
 * Where assistant turns start in a prompt, as token sequences: the family's
 * generation prompt without its trailing whitespace (`<|start_header_id|>assistant<|end_header_id|>`,
 * `<start_of_turn>model`, `<｜Assistant｜>`), and for DeepSeek V3 also
 * `<｜tool▁outputs▁end｜>` (its assistant turns after tool outputs start
 * there, with no generation prompt). `tail`: the ids of that trailing
 * whitespace, skipped before an open turn's text.
 */
export function assistantOpeners(tok: ChatTokenizer): { openers: number[][]; tail: number[] } {
  const probe = [{ role: "user" as const, content: "sim probe" }];
  const without = tok.renderText(probe);
  const withGen = tok.renderText(probe, { addGenerationPrompt: true });
  const gen = withGen.startsWith(without) ? withGen.slice(without.length) : "";
  const head = gen.replace(/\s+$/, "");
  const openers = head ? [tok.encode(head)] : [];
  if (tok.traits.family === "deepseek_v3") openers.push(tok.encode("<｜tool▁outputs▁end｜>"));
  return { openers, tail: tok.encode(gen.slice(head.length)) };
}
