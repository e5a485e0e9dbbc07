import { callHead, thinkBlocks, toolCallBlocks, without } from "./qwen-turn.ts";

/**
 * A scripted policy turn written in Qwen3's format (`<think>…</think>`
 * reasoning, Hermes `<tool_call>{"name": N, "arguments": ARGS}</tool_call>`
 * blocks, prose) as gpt-oss samples it in the harmony format, starting right
 * after the generation prompt `<|start|>assistant`:
 * - the think block → `<|channel|>analysis<|message|>…<|end|>`;
 * - with calls: the prose (if any) as a `commentary` preamble, then one
 *   `<|start|>assistant<|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS<|call|>`
 *   per call (ARGS compact JSON, or the text as written when it is not JSON,
 *   so malformed-call cases stay malformed);
 * - without calls: the prose as `<|channel|>final<|message|>…<|return|>`.
 * The turn therefore ends with a stop id (`<|call|>` or `<|return|>`), as a
 * real gpt-oss turn does; a simulated engine must not append another.
 * Note for turn counting: one harmony turn holds several `<|start|>assistant`
 * (one per message), so a turn starts at a `<|start|>assistant` that follows
 * a non-assistant message, not at every one.
 * Linear in the text (one-pass readers of `qwen-turn.ts`).
 * @see https://github.com/openai/harmony/blob/main/docs/format.md
 */
export function harmonyText(text: string): string {
  const think = thinkBlocks(text, true)[0];
  const noThink = think ? without(text, [think]) : text;
  const calls: { name: string; args: string }[] = [];
  const blocks = toolCallBlocks(noThink);
  for (const { body } of blocks) {
    const head = callHead(body);
    if (!head) {
      calls.push({ name: "unknown", args: body });
      continue;
    }
    const name = JSON.parse(head.name) as string;
    const raw = head.args.trim();
    let args = raw;
    try {
      args = JSON.stringify(JSON.parse(raw));
    } catch {
      args = raw;
    }
    calls.push({ name, args });
  }
  const rest = without(noThink, blocks);
  const prose = rest.trim();
  const messages: string[] = [];
  const reasoning = think?.body.trim();
  if (reasoning) messages.push(`<|channel|>analysis<|message|>${reasoning}<|end|>`);
  if (calls.length === 0) {
    messages.push(`<|channel|>final<|message|>${prose}<|return|>`);
  } else {
    if (prose) messages.push(`<|channel|>commentary<|message|>${prose}<|end|>`);
    for (const c of calls) messages.push(`<|channel|>commentary to=functions.${c.name} <|constrain|>json<|message|>${c.args}<|call|>`);
  }
  return messages.join("<|start|>assistant");
}
