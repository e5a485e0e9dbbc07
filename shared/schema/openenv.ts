import { z } from "zod";
import { ToolSchema } from "./tool.ts";

/**
 * Settings of the `openenv_agent` loop: the `openenv` section of the config
 * file, overridable per row by `extra_info.openenv` ({@link OpenEnvRowSettings}).
 * The wire protocol is OpenEnv's (meta-pytorch/OpenEnv, `openenv-core` 0.2.3,
 * commit 685de411): see docs/environments.md.
 */

/** A base URL an environment is reached at: `http(s)://` or `ws(s)://`, no query or fragment. */
const EnvUrl = z
  .string()
  .refine((s) => {
    try {
      const u = new URL(s);
      return ["http:", "https:", "ws:", "wss:"].includes(u.protocol) && !u.search && !u.hash;
    } catch {
      return false;
    }
  }, "must be an http(s):// or ws(s):// URL without query or fragment (the OpenEnv server's base URL, e.g. http://127.0.0.1:8000)");

/**
 * `base_url: "sandbox"`: each trajectory's environment is the OpenEnv server
 * of its own sandbox — the `base_url` of the trajectory's sandbox lease (the
 * tools file's `sandbox` block; the provider's create reply names it).
 */
export const SANDBOX_BASE_URL = "sandbox";

/** A configured base URL: {@link EnvUrl} or {@link SANDBOX_BASE_URL}. */
const EnvBaseUrl = z.union([z.literal(SANDBOX_BASE_URL), EnvUrl], {
  error: `must be an http(s):// or ws(s):// URL without query or fragment (the OpenEnv server's base URL, e.g. http://127.0.0.1:8000), or "${SANDBOX_BASE_URL}" (each trajectory's own sandbox)`,
});

/** How the loop talks to the environment: OpenEnv's WebSocket session (`/ws`) or its HTTP routes (`POST /reset`, `POST /step`). */
export const OpenEnvTransport = z.enum(["http", "websocket"], { error: "must be 'http' or 'websocket'" });
export type OpenEnvTransport = z.infer<typeof OpenEnvTransport>;

/**
 * How an assistant turn becomes the action JSON of `step`:
 * - `format: "text"` (default): `{[field]: text}`, `field` default `message`;
 *   text = the turn decoded without special tokens and its stop token, reasoning
 *   (`<think>…</think>`) removed, trimmed.
 * - `format: "json"`: a JSON object in that text (the whole text, a fenced
 *   ```` ```json ```` block, or the first balanced `{…}`); with `field`, `{[field]: object}`.
 * - `format: "tool_call"`: the arguments of the turn's first tool call (the
 *   model family's parser, `rollout.multi_turn.format`); with `field`, `{[field]: arguments}`.
 *   `tools` are rendered into the prompt so the model knows the call.
 * `on_invalid`: a turn with no action in it gets an error observation and no
 * `step` (`observe`, default) or ends the trajectory (`end`, `terminated_by: "invalid_action"`).
 */
const ActionFormat = z.enum(["text", "json", "tool_call"], { error: "must be 'text', 'json' or 'tool_call'" });
const OnInvalid = z.enum(["observe", "end"], { error: "must be 'observe' or 'end'" });
const FieldPath = z.string().min(1);
export const OpenEnvActionMapping = z.strictObject({
  format: ActionFormat.default("text"),
  field: FieldPath.nullable().default(null),
  on_invalid: OnInvalid.default("observe"),
  tools: z.array(ToolSchema).default([]),
});
export type OpenEnvActionMapping = z.infer<typeof OpenEnvActionMapping>;

/**
 * How an observation becomes turn text:
 * - `field`: a dotted path into the result's `observation` object (`prompt`,
 *   `text`, `messages.0.content`); a string value is the text as it is, any
 *   other value its JSON. null (default), or a path the observation lacks:
 *   the JSON text of the whole observation.
 * - `reset_field`: the same for the reset observation (null: `field`).
 * - `role`: the observation turn's role, `user` (default) or `tool`.
 * - `reset`: the reset observation is a new user message after the row's
 *   prompt (`append`, default), is appended to the prompt's last user message
 *   (`merge`; `append` when the last message is not a text user message), or
 *   is not shown (`ignore`).
 */
const ObservationRole = z.enum(["user", "tool"], { error: "must be 'user' or 'tool'" });
const ResetMode = z.enum(["append", "merge", "ignore"], { error: "must be 'append', 'merge' or 'ignore'" });
export const OpenEnvObservationMapping = z.strictObject({
  field: FieldPath.nullable().default(null),
  reset_field: FieldPath.nullable().default(null),
  role: ObservationRole.default("user"),
  reset: ResetMode.default("append"),
});
export type OpenEnvObservationMapping = z.infer<typeof OpenEnvObservationMapping>;

/**
 * The `openenv` config section (all fields have defaults):
 * - `base_url`: the server (null: every row must give `extra_info.openenv.base_url`), or
 *   `"sandbox"`: each trajectory's own sandbox's server (its lease's `base_url`; needs a tools
 *   file with a `sandbox` block — docs/environments.md, "Per-episode containers");
 * - `transport`: `websocket` (default; OpenEnv's session form, one environment per connection) or `http`;
 * - `timeout_ms`: deadline of one environment call (connect, reset, one step), default 30 000;
 * - `max_message_bytes`: cap of one reply, default 4 MiB;
 * - `reset_kwargs`: extra fields of the reset request (`seed`, env-specific options);
 * - `action`, `observation`: the mappings above;
 * - `reward`: the trajectory's `reward_score` from the step rewards — `sum` (default,
 *   the episode return), `last` (the last step's), or `row` (the row's own `reward_model`, as other loops).
 */
export const OpenEnvSettings = z.strictObject({
  base_url: EnvBaseUrl.nullable().default(null),
  transport: OpenEnvTransport.default("websocket"),
  timeout_ms: z.number().int().positive().max(3_600_000).default(30_000),
  max_message_bytes: z.number().int().positive().default(4 * 1024 * 1024),
  reset_kwargs: z.record(z.string(), z.unknown()).default({}),
  action: OpenEnvActionMapping.default(OpenEnvActionMapping.parse({})),
  observation: OpenEnvObservationMapping.default(OpenEnvObservationMapping.parse({})),
  reward: z.enum(["sum", "last", "row"], { error: "must be 'sum', 'last' or 'row'" }).default("sum"),
});
export type OpenEnvSettings = z.infer<typeof OpenEnvSettings>;
export type OpenEnvSettingsInput = z.input<typeof OpenEnvSettings>;

/**
 * A row's `extra_info.openenv`: any field of {@link OpenEnvSettings}, all
 * optional; `action`, `observation` and `reset_kwargs` merge one level into
 * the configured ones, the others replace them.
 */
export const OpenEnvRowSettings = z.strictObject({
  base_url: EnvBaseUrl.optional(),
  transport: OpenEnvTransport.optional(),
  timeout_ms: z.number().int().positive().max(3_600_000).optional(),
  max_message_bytes: z.number().int().positive().optional(),
  reset_kwargs: z.record(z.string(), z.unknown()).optional(),
  // Without defaults: a field the row leaves out keeps the configured value.
  action: z.strictObject({ format: ActionFormat.optional(), field: FieldPath.nullable().optional(), on_invalid: OnInvalid.optional(), tools: z.array(ToolSchema).optional() }).optional(),
  observation: z.strictObject({ field: FieldPath.nullable().optional(), reset_field: FieldPath.nullable().optional(), role: ObservationRole.optional(), reset: ResetMode.optional() }).optional(),
  reward: z.enum(["sum", "last", "row"], { error: "must be 'sum', 'last' or 'row'" }).optional(),
});
export type OpenEnvRowSettings = z.infer<typeof OpenEnvRowSettings>;

/**
 * One reset or step result as the server sends it (`ResetResponse` /
 * `StepResponse`, or a WebSocket `observation` message's `data`):
 * `observation` (an object), `reward` (a number, a boolean as 0/1, or null)
 * and `done`. `terminated`/`truncated` (Gymnasium's split of `done`) are not
 * in OpenEnv's schema; a server that sends them is understood, and either
 * one true ends the episode as `done` does.
 */
export const OpenEnvResult = z.looseObject({
  observation: z.record(z.string(), z.unknown(), { error: "expected an object" }),
  reward: z
    .union([z.number(), z.boolean(), z.null()], { error: "expected a number, a boolean or null" })
    .optional()
    .transform((r) => (typeof r === "boolean" ? (r ? 1 : 0) : (r ?? null))),
  done: z.boolean({ error: "expected a boolean" }).default(false),
  terminated: z.boolean({ error: "expected a boolean" }).optional(),
  truncated: z.boolean({ error: "expected a boolean" }).optional(),
});
export type OpenEnvResult = z.infer<typeof OpenEnvResult>;
