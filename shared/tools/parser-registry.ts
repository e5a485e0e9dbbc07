import { ConfigError } from "../errors.ts";
import { DeepSeekV3ToolCallParser } from "./deepseek-v3-parser.ts";
import { HarmonyToolCallParser } from "./harmony-parser.ts";
import { HermesToolCallParser } from "./hermes-parser.ts";
import { Llama3JsonToolCallParser } from "./llama3-json-parser.ts";
import { PythonicToolCallParser } from "./pythonic-parser.ts";
import { Qwen3CoderToolCallParser } from "./qwen3-coder-parser.ts";
import type { ToolCallParser, ToolCallParserOptions } from "./tool-call-parser.ts";

/** Makes a parser for one loop; receives the active tool schemas. */
export type ToolCallParserFactory = (opts: ToolCallParserOptions) => ToolCallParser;

const factories = new Map<string, ToolCallParserFactory>([
  ["hermes", () => new HermesToolCallParser()],
  ["qwen3_coder", (opts) => new Qwen3CoderToolCallParser(opts)],
  ["llama3_json", () => new Llama3JsonToolCallParser()],
  ["pythonic", () => new PythonicToolCallParser()],
  ["deepseek_v3", () => new DeepSeekV3ToolCallParser()],
  ["harmony", () => new HarmonyToolCallParser()],
]);

/**
 * Registers a tool-call parser under `name` (the value of
 * `rollout.multi_turn.format`), replacing one of the same name.
 */
export function registerToolCallParser(name: string, factory: ToolCallParserFactory): void {
  factories.set(name, factory);
}

/** Removes the parser registered under `name` (a module's own, e.g. when a test is done with it); built-ins can be removed too. */
export function unregisterToolCallParser(name: string): void {
  factories.delete(name);
}

/** Names of the registered parsers, sorted. */
export function toolCallParserNames(): string[] {
  return [...factories.keys()].sort();
}

/**
 * The parser named by `rollout.multi_turn.format`.
 * @throws ConfigError (path `rollout.multi_turn.format`) for an unknown name, listing the registered ones.
 * @see verl `ToolParser.get_tool_parser` (which raises ValueError "Unknown tool parser")
 */
export function createToolCallParser(name: string, opts: ToolCallParserOptions = {}): ToolCallParser {
  const f = factories.get(name);
  if (!f) {
    throw new ConfigError("rollout.multi_turn.format", `unknown tool-call parser '${name}'; registered parsers: ${toolCallParserNames().join(", ")}`);
  }
  return f(opts);
}
