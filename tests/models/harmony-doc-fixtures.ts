/**
 * The documented examples of OpenAI's harmony guide
 * (https://github.com/openai/harmony/blob/main/docs/format.md), copied
 * verbatim, and the conversations that produce them.
 */
import type { ToolSchema } from "../../shared/schema/index.ts";

export const DOC_SYSTEM =
  "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>";

export const DOC_DEVELOPER =
  '<|start|>developer<|message|># Instructions\n\nUse a friendly tone.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Gets the location of the user.\ntype get_location = () => any;\n\n// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n// The city and state, e.g. San Francisco, CA\nlocation: string,\nformat?: "celsius" | "fahrenheit", // default: celsius\n}) => any;\n\n// Gets the current weather in the provided list of locations.\ntype get_multiple_weathers = (_: {\n// List of city and state, e.g. ["San Francisco, CA", "New York, NY"]\nlocations: string[],\nformat?: "celsius" | "fahrenheit", // default: celsius\n}) => any;\n\n} // namespace functions<|end|>';

/** "Here's a complete input example including the definition of two functions". */
export const DOC_INPUT = `${DOC_SYSTEM}${DOC_DEVELOPER}<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant`;

/** The documented model output with a tool call ("Receiving tool calls"), after the generation prompt. */
export const DOC_CALL_OUTPUT =
  '<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>';

/** "Once you have gathered the output for the tool calls you can run inference with the complete content". */
export const DOC_AFTER_TOOL = `${DOC_SYSTEM}${DOC_DEVELOPER}<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant${DOC_CALL_OUTPUT}<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sunny": true, "temperature": 20}<|end|><|start|>assistant`;

export const DOC_TOOLS: ToolSchema[] = [
  { type: "function", function: { name: "get_location", description: "Gets the location of the user.", parameters: { type: "object", properties: {} } } },
  {
    type: "function",
    function: {
      name: "get_current_weather",
      description: "Gets the current weather in the provided location.",
      parameters: {
        type: "object",
        properties: {
          location: { type: "string", description: "The city and state, e.g. San Francisco, CA" },
          format: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
        },
        required: ["location"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "get_multiple_weathers",
      description: "Gets the current weather in the provided list of locations.",
      parameters: {
        type: "object",
        properties: {
          locations: { type: "array", items: { type: "string" }, description: 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]' },
          format: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
        },
        required: ["locations"],
      },
    },
  },
];

/** Template kwargs of the documented system message. */
export const DOC_KWARGS = { reasoning_effort: "high", current_date: "2025-06-28" };
