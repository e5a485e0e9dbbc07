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
 * @see https://github.com/openai/harmony/blob/main/docs/format.md
 */
export function harmonyText(text: string): string {
  const think = /<think>([\s\S]*?)<\/think>\s*/.exec(text);
  let rest = think ? text.slice(0, think.index) + text.slice(think.index + think[0].length) : text;
  const calls: { name: string; args: string }[] = [];
  rest = rest.replace(/\s*<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, (_m, body: string) => {
    const m = /^\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*([\s\S]*)\}$/.exec(body.trim());
    if (!m) {
      calls.push({ name: "unknown", args: body });
      return "";
    }
    const name = JSON.parse(m[1]!) as string;
    const raw = m[2]!.trim();
    let args = raw;
    try {
      args = JSON.stringify(JSON.parse(raw));
    } catch {
      args = raw;
    }
    calls.push({ name, args });
    return "";
  });
  const prose = rest.trim();
  const messages: string[] = [];
  const reasoning = think?.[1]?.trim();
  if (reasoning) messages.push(`<|channel|>analysis<|message|>${reasoning}<|end|>`);
  if (calls.length === 0) {
    messages.push(`<|channel|>final<|message|>${prose}<|return|>`);
  } else {
    if (prose) messages.push(`<|channel|>commentary<|message|>${prose}<|end|>`);
    for (const c of calls) messages.push(`<|channel|>commentary to=functions.${c.name} <|constrain|>json<|message|>${c.args}<|call|>`);
  }
  return messages.join("<|start|>assistant");
}
