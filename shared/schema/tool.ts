import { z } from "zod";

/**
 * A tool's schema in OpenAI function format, passed to the chat template as
 * `tools`. Unlike verl (which drops unknown JSON-Schema keys through pydantic),
 * every key of `parameters` is kept as given.
 */
export const ToolSchema = z.object({
  type: z.literal("function").default("function"),
  function: z.object({
    name: z.string().min(1),
    description: z.string().default(""),
    parameters: z
      .looseObject({ type: z.literal("object").default("object"), properties: z.record(z.string(), z.unknown()).default({}) })
      .default({ type: "object", properties: {} }),
  }),
});
export type ToolSchema = z.infer<typeof ToolSchema>;

/**
 * One webhook tool from the tools file: `{name, url, schema, timeout_ms, max_retries, max_reply_bytes?}`;
 * unknown keys are errors. `max_reply_bytes` caps the reply body (default 4 MiB, counted while it streams;
 * a larger reply is an error observation naming the cap).
 */
export const ToolSpec = z
  .strictObject({
    name: z.string().min(1),
    url: z.string().url(),
    schema: ToolSchema,
    timeout_ms: z.number().int().positive().default(30_000),
    max_retries: z.number().int().min(0).default(2),
    max_reply_bytes: z.number().int().positive().optional(),
  })
  // The model is shown schema.function.name and calls by it; a different `name` would route every call to "unknown tool".
  .refine((t) => t.schema.function.name === t.name, {
    message: "schema.function.name must equal the tool's name (the model calls the tool by the name its schema shows)",
    path: ["schema", "function", "name"],
  });
export type ToolSpec = z.infer<typeof ToolSpec>;

/**
 * Where a simulated user lives: `{name, url, timeout_ms, max_retries, max_reply_bytes?}` (an
 * `interactions` entry of the tools file). `timeout_ms` is per attempt,
 * milliseconds (default 30 000); `max_retries` counts retries after the first
 * attempt (default 2), as for tools; `max_reply_bytes` caps the reply (default 4 MiB).
 * Unknown keys are errors.
 * A row picks one by verl's `extra_info.interaction_kwargs.name`
 * (verl `ToolAgentLoop.run`: `interaction_map[interaction_kwargs["name"]]`).
 */
export const InteractionSpec = z.strictObject({
  name: z.string().min(1).default("interaction"),
  url: z.string().url(),
  timeout_ms: z.number().int().positive().default(30_000),
  max_retries: z.number().int().min(0).default(2),
  max_reply_bytes: z.number().int().positive().optional(),
});
export type InteractionSpec = z.infer<typeof InteractionSpec>;

/**
 * A tools file (YAML or JSON): `{tools: [...], interactions?: [...]}`. Tool
 * names must be unique, and so must interaction names. `interactions`
 * (default `[]`) are the simulated users rows reach through
 * `extra_info.interaction_kwargs` (docs/tool-webhooks.md).
 */
export const ToolsFile = z.strictObject({
  tools: z.array(ToolSpec).refine((ts) => new Set(ts.map((t) => t.name)).size === ts.length, "tool names must be unique"),
  interactions: z
    .array(InteractionSpec)
    .refine((is) => new Set(is.map((i) => i.name)).size === is.length, "interaction names must be unique")
    .default([]),
});
export type ToolsFile = z.infer<typeof ToolsFile>;
