import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { toolsBudgetWarning } from "../../infra/cli/runtime.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";

// Fresh-user finding 5: a server's tool list larger than rollout.prompt_length silently truncated every prompt.
const tok = await defaultTokenizer();
const example = parseToolsFile(readFileSync(join(import.meta.dir, "..", "..", "infra", "tools", "tools.example.json"), "utf8"), { vars: { port: 1 } }).tools.map((t) => t.schema);
const wide = (i: number): ToolSchema => ({ type: "function", function: { name: `tool_${i}`, description: "Looks a thing up in a catalogue of things. ".repeat(4), parameters: { type: "object", properties: { q: { type: "string", description: "what to look up" } }, required: ["q"] } } });

test("the example tools fit the default prompt budget: no warning", () => {
  const n = tok.renderIds([{ role: "user", content: "" }], { tools: example, addGenerationPrompt: true }).length;
  expect(n).toBeLessThan(512);
  expect(toolsBudgetWarning(tok, example, 512)).toBeNull();
  expect(toolsBudgetWarning(tok, [], 1)).toBeNull();
});

test("13 tools over prompt_length 512: the warning names the count, the tokens and the fixes; the boundary is 'at or over'", () => {
  const tools = Array.from({ length: 13 }, (_, i) => wide(i));
  const n = tok.renderIds([{ role: "user", content: "" }], { tools, addGenerationPrompt: true }).length;
  expect(n).toBeGreaterThan(512);
  expect(toolsBudgetWarning(tok, tools, 512)).toBe(
    `warning    the 13 tool schemas alone take ${n} tokens of the prompt, at or over rollout.prompt_length 512: every prompt that offers all of them is truncated (the tools block included); raise rollout.prompt_length (--prompt-length) or offer fewer tools (an MCP server's tools allow-list, a row's extra_info.tool_selection)`,
  );
  expect(toolsBudgetWarning(tok, tools, n)).not.toBeNull();
  expect(toolsBudgetWarning(tok, tools, n + 1)).toBeNull();
});
