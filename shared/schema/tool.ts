import { z } from "zod";
import { MAX_TIMER_MS, retriesCount, timerMs } from "./config.ts";

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
 * The URL of a webhook tool, simulated user or MCP server: absolute, `http:`
 * or `https:` only (`Invalid URL` when it does not parse; another scheme such
 * as `ftp:` or `ws:` would pass `url()` and fail every call later).
 */
function callUrl() {
  return z
    .string()
    .url()
    .refine((s) => {
      // Runs after a failed url() too (zod 4 checks continue); that one already reported the unparseable URL.
      if (!URL.canParse(s)) return true;
      const p = new URL(s).protocol;
      return p === "http:" || p === "https:";
    }, "must be an http: or https: URL");
}

// RFC 9110 §5.6.2: token = 1*tchar; tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/**
 * Extra HTTP headers, name → value: each name an HTTP token (RFC 9110 §5.6.2),
 * each value free of CR, LF and NUL (which would split or end the header);
 * an issue at `headers.<name>` otherwise. Checked here, not by fetch at the
 * first request.
 */
const HttpHeaders = z.record(z.string(), z.string()).superRefine((h, ctx) => {
  for (const [name, value] of Object.entries(h)) {
    if (!HEADER_NAME.test(name)) ctx.addIssue({ code: "custom", path: [name], message: "header name must be an HTTP token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons)" });
    else if (/[\r\n\0]/.test(value)) ctx.addIssue({ code: "custom", path: [name], message: "header value must not contain CR, LF or NUL" });
  }
});

/**
 * One webhook tool from the tools file: `{name, url, schema, timeout_ms, max_retries, max_reply_bytes?}`;
 * unknown keys are errors. `max_reply_bytes` caps the reply body (default 4 MiB, counted while it streams;
 * a larger reply is an error observation naming the cap). `url` is http(s) only; `timeout_ms` (ms, default
 * 30 000) is at most 2147483647 (setTimeout's largest delay); `max_retries` (default 2) at most 10.
 */
export const ToolSpec = z
  .strictObject({
    name: z.string().min(1),
    url: callUrl(),
    schema: ToolSchema,
    timeout_ms: timerMs().positive().default(30_000),
    max_retries: retriesCount().default(2),
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
 * `url` is http(s) only; `timeout_ms` at most 2147483647, `max_retries` at most 10.
 * Unknown keys are errors.
 * A row picks one by verl's `extra_info.interaction_kwargs.name`
 * (verl `ToolAgentLoop.run`: `interaction_map[interaction_kwargs["name"]]`).
 */
export const InteractionSpec = z.strictObject({
  name: z.string().min(1).default("interaction"),
  url: callUrl(),
  timeout_ms: timerMs().positive().default(30_000),
  max_retries: retriesCount().default(2),
  max_reply_bytes: z.number().int().positive().optional(),
});
export type InteractionSpec = z.infer<typeof InteractionSpec>;

/**
 * An MCP server of the tools file (`mcp_servers` entry; docs/tool-webhooks.md §6):
 * exactly one of `url` (Streamable HTTP, every runtime) or `command` (stdio: a
 * child process, `serve`/`worker`/`rollout` only) with its `args` and `env`;
 * `headers` (HTTP only) go on every request. `timeout_ms` bounds each request,
 * milliseconds (default 30 000); `max_retries` counts retries of a failed
 * attempt (default 2), applied only to idempotent requests (`initialize`,
 * `tools/list`) and to calls of tools the server annotates `readOnlyHint` or
 * `idempotentHint`; `max_reply_bytes` caps a reply (default 4 MiB); `tools`
 * lists the server's tools to offer (default: all it lists; an empty list is
 * refused, it would offer none). `url` is http(s) only; `timeout_ms` is at most
 * 2147483647 and `max_retries` at most 10 (as for webhook tools); header names
 * are HTTP tokens and values hold no CR, LF or NUL. Unknown keys are errors.
 * `tasks` picks which calls run as MCP tasks (only on a server that
 * advertises `tasks.requests.tools.call`): `auto` (default) the tools whose
 * `execution.taskSupport` is `required`; `always` also those where it is
 * `optional`; `never` none (a tool that requires a task is then refused at
 * start). `task_timeout_ms` bounds the wait for one task's result,
 * milliseconds from its creation (default 3 600 000; the task's requested `ttl`
 * is it plus `timeout_ms`), as `timeout_ms` bounds a webhook's asynchronous result.
 */
export const McpServerSpec = z
  .strictObject({
    name: z.string().min(1),
    url: callUrl().optional(),
    command: z.string().min(1).optional(),
    args: z.array(z.string()).optional(),
    env: z.record(z.string(), z.string()).optional(),
    headers: HttpHeaders.optional(),
    timeout_ms: timerMs().positive().default(30_000),
    max_retries: retriesCount().default(2),
    max_reply_bytes: z.number().int().positive().optional(),
    tasks: z.enum(["auto", "always", "never"], { error: "must be one of auto (tasks for tools that require them), always (also for tools that allow them) or never" }).optional(),
    task_timeout_ms: timerMs().positive().optional(),
    tools: z
      .array(z.string().min(1))
      .min(1, "an empty allow-list offers no tools; remove `tools` to offer all")
      .refine((ts) => new Set(ts).size === ts.length, "tool names must be unique")
      .optional(),
  })
  .superRefine((s, ctx) => {
    if ((s.url === undefined) === (s.command === undefined)) {
      ctx.addIssue({ code: "custom", path: [], message: "set exactly one of url (Streamable HTTP) or command (stdio)" });
      return;
    }
    for (const k of ["args", "env"] as const) {
      if (s.url !== undefined && s[k] !== undefined) ctx.addIssue({ code: "custom", path: [k], message: `${k} is for stdio servers (command); this server has a url` });
    }
    if (s.command !== undefined && s.headers !== undefined) ctx.addIssue({ code: "custom", path: ["headers"], message: "headers are for HTTP servers (url); this server has a command" });
  });
export type McpServerSpec = z.infer<typeof McpServerSpec>;

/** The longest lease TTL or sandbox lifetime, seconds: {@link MAX_TIMER_MS} in whole seconds (about 24.8 days), as each becomes a timer in ms. */
const MAX_LEASE_SECONDS = Math.floor(MAX_TIMER_MS / 1000);

/**
 * A sandbox lifecycle (the tools file's `sandbox` block; docs/environments.md
 * "Sandboxes and leases"): every trajectory that uses the tools gets its own
 * sandbox, held as a lease by its session. `create_url`, `release_url` and the
 * optional `heartbeat_url` are POSTed (JSON, signed like tool webhooks) in the
 * contract of shared/schema/sandbox.ts. Fields:
 * - `create`: `first_use` (default: at the trajectory's first tool call) or `start` (before its first turn).
 * - `ttl_s`: seconds a lease lives without a heartbeat (default 300, min 3); the owner refreshes it every
 *   `ttl_s / 3` s, so a dead owner's sandbox is released by a reaper within `ttl_s` of its last heartbeat.
 * - `lifetime_s`: the sandbox's own lifetime sent to the provider (default: the trajectory deadline plus
 *   `ttl_s`; refused at start when below the deadline).
 * - `create_timeout_ms` (default 60 000) is the create deadline: a create not answered by then is released by
 *   its lease id (never orphaned) and retried `create_retries` times (default 2) with a new lease id.
 * - `release_timeout_ms` (default 30 000) and `release_retries` (default 3) bound each release.
 * - `max_creates_per_s` (default 10) and `create_burst` (default 1) are a token bucket: creates are spaced
 *   `1 / max_creates_per_s` s apart, and no second holds more than `max_creates_per_s + create_burst - 1`
 *   of them; `max_live` (default 256) caps the sandboxes that exist at once. Both are kept in the store and
 *   shared by every process on it (the memory store: this process only).
 * - `headers`, `max_reply_bytes`: as for MCP servers.
 * URLs are http(s) only; unknown keys are errors.
 */
export const SandboxSpec = z.strictObject({
  create_url: callUrl(),
  release_url: callUrl(),
  heartbeat_url: callUrl().optional(),
  create: z.enum(["first_use", "start"]).default("first_use"),
  ttl_s: z.number().int().min(3).max(MAX_LEASE_SECONDS).default(300),
  lifetime_s: z.number().int().positive().max(MAX_LEASE_SECONDS).optional(),
  create_timeout_ms: timerMs().positive().default(60_000),
  create_retries: retriesCount().default(2),
  release_timeout_ms: timerMs().positive().default(30_000),
  release_retries: retriesCount().default(3),
  max_creates_per_s: z.number().positive().max(1_000_000).default(10),
  create_burst: z.number().int().min(1).max(1_000_000).optional(),
  max_live: z.number().int().min(1).max(10_000_000).default(256),
  headers: HttpHeaders.optional(),
  max_reply_bytes: z.number().int().positive().optional(),
});
export type SandboxSpec = z.infer<typeof SandboxSpec>;

/**
 * A tools file (YAML or JSON): `{tools?: [...], interactions?: [...], mcp_servers?: [...]}`.
 * Tool names must be unique, and so must interaction and MCP server names.
 * `tools` (default `[]`) are webhook tools; `interactions` (default `[]`) the
 * simulated users rows reach through `extra_info.interaction_kwargs`;
 * `mcp_servers` (default `[]`) MCP servers whose tools are listed at start
 * (docs/tool-webhooks.md); `sandbox` (optional) a sandbox lifecycle whose
 * leases the trajectories hold ({@link SandboxSpec}). A name clash between a
 * webhook tool and an MCP tool is found when the servers are listed, not here.
 */
export const ToolsFile = z.strictObject({
  tools: z
    .array(ToolSpec)
    .refine((ts) => new Set(ts.map((t) => t.name)).size === ts.length, "tool names must be unique")
    .default([]),
  interactions: z
    .array(InteractionSpec)
    .refine((is) => new Set(is.map((i) => i.name)).size === is.length, "interaction names must be unique")
    .default([]),
  mcp_servers: z
    .array(McpServerSpec)
    .refine((ss) => new Set(ss.map((s) => s.name)).size === ss.length, "MCP server names must be unique")
    .default([]),
  sandbox: SandboxSpec.optional(),
});
export type ToolsFile = z.infer<typeof ToolsFile>;
