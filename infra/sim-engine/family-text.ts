import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { harmonyText } from "./harmony-text.ts";
import { pythonicCall } from "../../shared/models/gemma3-messages.ts";
import { callHead, thinkBlocks, toolCallBlocks, without } from "./qwen-turn.ts";

/**
 * A scripted policy's text turns are written once, in Qwen3's format
 * (`<think>…</think>` reasoning, Hermes `<tool_call>{"name": …, "arguments": …}</tool_call>`
 * blocks). The simulated engine samples them in the chosen model family's
 * own format, so the same example runs for every family:
 * - `qwen3` and model directories: unchanged;
 * - `llama3_1`: `{"name": N, "parameters": ARGS}` objects joined by `; `;
 * - `deepseek_v3`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
 * - `gemma3`: `[N(k=v, …)]`;
 * - `gpt_oss`: harmony messages ending with `<|call|>` or `<|return|>` (see `harmonyText`).
 * Families without a reasoning format (all three) drop the `<think>` block.
 * A call whose arguments are not valid JSON keeps its arguments text
 * verbatim in the family's shape, so malformed-call cases stay malformed.
 * Linear in the text (one-pass readers of `qwen-turn.ts`).
 */
export function familyText(tok: ChatTokenizer, text: string): string {
  const family = tok.traits.family;
  if (family === "gpt_oss") return harmonyText(text);
  if (family !== "llama3_1" && family !== "deepseek_v3" && family !== "gemma3") return text;
  const noThink = without(text, thinkBlocks(text));
  const calls: { name: string; args: string; parsed?: Record<string, unknown> }[] = [];
  const blocks = toolCallBlocks(noThink);
  for (const { body } of blocks) {
    const head = callHead(body);
    if (!head) {
      calls.push({ name: "", args: body });
      continue;
    }
    const name = JSON.parse(head.name) as string;
    const args = head.args.trim();
    let parsed: Record<string, unknown> | undefined;
    try {
      const v = JSON.parse(args);
      if (v && typeof v === "object" && !Array.isArray(v)) parsed = v;
    } catch {
      parsed = undefined;
    }
    calls.push({ name, args, parsed });
  }
  const rest = without(noThink, blocks);
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
  const head = gen.trimEnd();
  const openers = head ? [tok.encode(head)] : [];
  if (tok.traits.family === "deepseek_v3") openers.push(tok.encode("<｜tool▁outputs▁end｜>"));
  return { openers, tail: tok.encode(gen.slice(head.length)) };
}
