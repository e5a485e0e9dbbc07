import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { CallToolResultSchema, CreateTaskResultSchema, ErrorCode, McpError, type CallToolResult, type GetTaskResult } from "@modelcontextprotocol/sdk/types.js";
import type { jsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/types.js";
import { ConfigError, ToolError } from "../errors.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES, OutboundHttpError, readTextCapped, redactUrl, type OutboundFetch } from "../http/outbound.ts";
import { sleepUnlessAborted } from "../http/sleep.ts";
import { ToolSchema, type McpServerSpec } from "../schema/index.ts";
import { checkToolArguments, pyList, toolCallId, type ToolCallRequest, type ToolContentPart, type ToolExecutor, type ToolResult, type ToolTaskWait } from "./webhook-tool-client.ts";

/**
 * Makes the transport of one stdio server (`command`); injected by runtimes that have processes (infra/tools/mcp-stdio.ts). A transport that closes itself
 * for a reason of its own (a flood of non-JSON-RPC output, a reply over its cap) may set `closeReason`: the requests
 * it failed then read that reason instead of "closed the connection".
 */
export type McpTransportFactory = (server: McpServerSpec) => Transport & { closeReason?: string };

/** Capabilities and tuning of {@link McpToolClient.connect}. */
export interface McpConnectOptions {
  /** Transport for `command` servers; without it a `command` server is a ConfigError (Workers, Deno functions). */
  stdio?: McpTransportFactory;
  /** The fetch of HTTP servers (default the global `fetch`); tests and the in-process example inject one. */
  fetch?: OutboundFetch;
  /** First retry delay, milliseconds (default 250); doubles each retry, at most `retryMaxTimeoutMs` (default 5000). */
  retryMinTimeoutMs?: number;
  retryMaxTimeoutMs?: number;
}

/**
 * The `_meta` keys of every `tools/call` edgeloop sends: the idempotency key, the trajectory key, the turn, the row's
 * `create_kwargs`, and, for a tools file with a `sandbox` lifecycle, the trajectory's sandbox and lease ids.
 */
export const MCP_META = {
  call_id: "edgeloop/call_id",
  key: "edgeloop/key",
  turn: "edgeloop/turn",
  create_kwargs: "edgeloop/create_kwargs",
  sandbox_id: "edgeloop/sandbox_id",
  lease_id: "edgeloop/lease_id",
} as const;

/**
 * The SDK validates `structuredContent` against a tool's `outputSchema` with
 * ajv, which compiles schemas to code (refused on Workers). edgeloop hands
 * structured content to the model as JSON text and does not judge it, so
 * every output is accepted.
 */
const ACCEPT_ANY_OUTPUT: jsonSchemaValidator = {
  getValidator: () => (input: unknown) => ({ valid: true, data: input as never, errorMessage: undefined }),
};

/** Pages of `tools/list` read at most, per server (a server that pages forever is refused). */
const MAX_LIST_PAGES = 100;

/** How an HTTP request failed, carried to the SDK in a JSON-RPC error's `data.edgeloop_failure`. */
type HttpFailure = "timeout" | "too_large" | "redirect" | "connection" | "lost";

/** Why a request failed, for the observation and the retry decision. */
interface Failure {
  reason: string;
  /** The request may be sent again (a timeout or a lost connection; never an answer of the server). */
  transient: boolean;
  /** The connection is unusable: the next request opens a new one. */
  reset: boolean;
  /** The server says it did not run the request (404: it forgot the session): safe to send again, idempotent or not. */
  unsent?: boolean;
}

/** MCP's tool-name rule: 1–128 characters of A–Z, a–z, 0–9, `_`, `-`, `.` (spec 2025-11-25, Tools › Tool names). */
const MCP_TOOL_NAME = /^[A-Za-z0-9_.-]{1,128}$/;

/** One MCP server: a lazily (re)opened SDK client over its transport. */
class McpConnection {
  private client: Promise<{ client: Client; transport: Transport }> | undefined;
  /** The newest transport opened, for the reason it gave when it closed itself. */
  private latest: (Transport & { closeReason?: string }) | undefined;
  readonly maxReplyBytes: number;

  constructor(
    readonly spec: McpServerSpec,
    private readonly transport: () => Transport,
  ) {
    this.maxReplyBytes = spec.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES;
  }

  /** Why the newest transport closed itself (see {@link McpTransportFactory}), if it did. */
  get closeReason(): string | undefined {
    return this.latest?.closeReason;
  }

  /** `MCP server 'name' (url or command)`, for messages; the URL redacted. */
  get label(): string {
    return `MCP server '${this.spec.name}'`;
  }

  async open(): Promise<Client> {
    if (!this.client) {
      const opening = (async () => {
        const client = new Client({ name: "edgeloop", version: "0.1.0" }, { jsonSchemaValidator: ACCEPT_ANY_OUTPUT });
        const transport = this.transport();
        this.latest = transport;
        try {
          await client.connect(transport, { timeout: this.spec.timeout_ms });
        } catch (e) {
          // A connect that failed (a timed-out initialize included) ends its transport: a stdio child is stopped, not left behind.
          await client.close().catch(() => undefined);
          await transport.close().catch(() => undefined);
          throw e;
        }
        return { client, transport };
      })();
      this.client = opening;
      // A failed open is forgotten so that the next request tries again.
      opening.catch(() => {
        if (this.client === opening) this.client = undefined;
      });
    }
    return (await this.client).client;
  }

  /** Drops `client` (when it is still the current one) so that the next request reconnects. */
  reset(client: Client): void {
    const current = this.client;
    void current?.then((c) => {
      if (c.client === client && this.client === current) {
        this.client = undefined;
        void c.client.close().catch(() => undefined);
      }
    }, () => undefined);
  }

  /** Ends the HTTP session (`DELETE`, bounded by `timeout_ms`; failures ignored) and closes the transport. */
  async close(): Promise<void> {
    const c = this.client;
    this.client = undefined;
    const open = await c?.catch(() => undefined);
    if (!open) return;
    if (open.transport instanceof StreamableHTTPClientTransport) await open.transport.terminateSession().catch(() => undefined);
    await open.client.close().catch(() => undefined);
  }
}

/** A tool of an MCP server as edgeloop offers it. */
interface McpToolEntry {
  name: string;
  schema: ToolSchema;
  server: McpConnection;
  /** The server annotates the tool `readOnlyHint` or `idempotentHint`: a failed attempt may be sent again. */
  idempotent: boolean;
  /** Calls run as MCP tasks (the server's `tasks.requests.tools.call` capability, the tool's `execution.taskSupport`, the spec's `tasks`). */
  task: boolean;
}

/**
 * MCP tasks, as the SDK 1.32.2 implements them (protocol revision 2025-11-25,
 * "Tasks", experimental; `client.experimental.tasks`, types.js
 * `CreateTaskResultSchema`, `GetTaskResultSchema`, `TaskStatusSchema`):
 * - A server offers them with the capability `tasks.requests.tools.call`
 *   (`tasks.list`, `tasks.cancel` optional); a tool says whether it runs as one
 *   with `execution.taskSupport`: `required` (a plain call is refused,
 *   `MethodNotFound`), `optional`, or `forbidden` (the default). Without the
 *   capability a client must not ask for a task, whatever the tool says.
 * - A task-augmented `tools/call` carries `params.task: {ttl?}` (ms the server
 *   should keep the task from creation) and is answered at once with
 *   `CreateTaskResult` `{task: {taskId, status, ttl (ms or null: unlimited),
 *   createdAt, lastUpdatedAt, pollInterval? (ms between polls the server
 *   asks for), statusMessage?}}`.
 * - `tasks/get {taskId}` gives the task; its `status` is `working`,
 *   `input_required` (the server waits for an elicitation or sampling answer,
 *   delivered through `tasks/result`), or terminal `completed`, `failed`,
 *   `cancelled`. `tasks/result {taskId}` gives what the request would have
 *   answered (a `CallToolResult`, `_meta["io.modelcontextprotocol/related-task"]`
 *   naming the task), blocking until the task is terminal; `tasks/cancel`
 *   cancels. An unknown or expired task id is a JSON-RPC error `-32602`
 *   (InvalidParams, "Task not found"). The SDK's `InMemoryTaskStore` binds a
 *   task to the MCP session that created it: a server whose tasks must survive
 *   the client's reconnect (a resumed trajectory opens a new session) keeps
 *   them in a store that does not.
 * @see https://modelcontextprotocol.io/specification/2025-11-25/basic/utilities/tasks
 */
export const MCP_TASKS_REVISION = "2025-11-25";

/** Milliseconds between `tasks/get` polls when the server names no `pollInterval` (the SDK's default); polls are at least {@link MIN_POLL_MS} apart. */
const DEFAULT_POLL_MS = 1000;
/** A server's `task_timeout_ms` when the tools file gives none: one hour (the default trajectory deadline). */
export const DEFAULT_TASK_TIMEOUT_MS = 3_600_000;
const MIN_POLL_MS = 10;

/**
 * Calls the tools of MCP servers (issue 29) through the official SDK client:
 * Streamable HTTP for `url` servers (every runtime; per-request deadline
 * `timeout_ms`, reply cap `max_reply_bytes` counted as it streams, redirects
 * refused, as shared/http/outbound.ts does for webhooks), stdio for
 * `command` servers through an injected {@link McpTransportFactory}.
 *
 * Each `tools/call` carries `_meta` {@link MCP_META}: `edgeloop/call_id` is the
 * call's idempotency key `{key}:{turn}:{index}` (the same on every retry),
 * so a server can deduplicate. Results become observations as webhook replies
 * do: the text parts joined by `"\n"`; with no text part, `structuredContent`
 * as JSON text; `isError: true` an error observation `Error executing tool
 * 'x': <text>`; image parts (MCP `ImageContent` `{type: "image", data:
 * <base64>, mimeType}`) become `parts` with `data:` URI images beside the
 * text, in order (see `ToolResult.parts`); audio and resource parts are
 * refused (an error observation naming the part's type). A failure is never thrown: timeouts,
 * a lost connection (a server that dies mid-call), a reply over the cap and a
 * JSON-RPC error all become `ok: false` results naming the tool.
 *
 * Retries: `initialize` and `tools/list` are retried (`max_retries`, backoff
 * 250 ms doubling to 5 s); a `tools/call` only when the server annotates the
 * tool `readOnlyHint` or `idempotentHint`, and only after a timeout or a lost
 * connection (never after an answer, `isError` included). A lost connection
 * is reopened for the next request (a stdio server is started again); a
 * `404` (the server forgot the HTTP session, so ran nothing) opens a new
 * session and sends the call again, idempotent or not.
 * @see https://modelcontextprotocol.io/specification/2025-06-18/server/tools (tools/list, tools/call, annotations)
 */
export class McpToolClient implements ToolExecutor {
  readonly schemas: readonly ToolSchema[];
  readonly names: readonly string[];
  private readonly byName: Map<string, McpToolEntry>;

  private constructor(
    private readonly entries: readonly McpToolEntry[],
    private readonly connections: readonly McpConnection[],
    private readonly opts: McpConnectOptions,
  ) {
    this.byName = new Map(entries.map((e) => [e.name, e]));
    this.schemas = entries.map((e) => e.schema);
    this.names = entries.map((e) => e.name);
  }

  /**
   * Connects to every server (in parallel), lists its tools (`tools/list`, all
   * pages) and keeps those of its `tools` allow-list (default all), in the
   * server's order, servers in the file's order. Each tool's schema is the
   * OpenAI function form `{type: "function", function: {name, description,
   * parameters: inputSchema}}`, rendered into the chat template like a
   * webhook tool's.
   * @throws ConfigError for a `command` server without `opts.stdio`, an
   *   allow-listed tool the server does not list, a tool name offered by two
   *   servers, or a tool whose `inputSchema` is not a JSON-Schema object;
   *   ToolError naming the server when it cannot be reached or listed.
   *   Servers already connected are closed before it throws.
   */
  static async connect(servers: readonly McpServerSpec[], opts: McpConnectOptions = {}): Promise<McpToolClient> {
    const connections = servers.map((spec, i) => {
      if (spec.command !== undefined && !opts.stdio) {
        throw new ConfigError(`mcp_servers[${i}].command`, `MCP server '${spec.name}': stdio servers need a runtime that starts processes (edgeloop serve, worker, rollout); give the server a url (Streamable HTTP) here`);
      }
      return new McpConnection(spec, spec.command !== undefined ? () => opts.stdio!(spec) : () => httpTransport(spec, opts.fetch));
    });
    const listed = await Promise.allSettled(connections.map((c, i) => listServerTools(c, i, opts)));
    const failed = listed.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) {
      await Promise.all(connections.map((c) => c.close()));
      throw failed.reason;
    }
    const entries: McpToolEntry[] = [];
    const owner = new Map<string, string>();
    for (const r of listed as PromiseFulfilledResult<McpToolEntry[]>[]) {
      for (const e of r.value) {
        const other = owner.get(e.name);
        if (other !== undefined) {
          await Promise.all(connections.map((c) => c.close()));
          throw new ConfigError("mcp_servers", `tool '${e.name}' is offered by MCP server '${other}' and by MCP server '${e.server.spec.name}'; tool names must be unique (use the servers' tools allow-lists)`);
        }
        owner.set(e.name, e.server.spec.name);
        entries.push(e);
      }
    }
    return new McpToolClient(entries, connections, opts);
  }

  /** The name of the MCP server offering tool `name`, or undefined. */
  serverOf(name: string): string | undefined {
    return this.byName.get(name)?.server.spec.name;
  }

  select(names: readonly string[]): McpToolClient {
    const keep = new Set(names);
    return new McpToolClient(this.entries.filter((e) => keep.has(e.name)), this.connections, this.opts);
  }

  /** Closes every server's connection (a stdio server's process ends with its stdin). Calls after it reconnect. */
  async close(): Promise<void> {
    await Promise.all(this.connections.map((c) => c.close()));
  }

  async call(req: ToolCallRequest): Promise<ToolResult> {
    const entry = this.byName.get(req.name);
    if (!entry) return { ok: false, call_id: "", attempts: 0, content: `Unknown function '${req.name}'. Available tools: ${pyList(this.names)}` };
    const argError = checkToolArguments(entry.schema, req.arguments);
    if (argError) return { ok: false, call_id: "", attempts: 0, content: `Invalid arguments for '${req.name}': ${argError}` };
    const call_id = toolCallId(req.key, req.turn, req.index);
    const fail = (reason: string, attempts: number): ToolResult => ({ ok: false, call_id, attempts, content: `Error executing tool '${req.name}': ${reason}` });
    const meta: Record<string, unknown> = { [MCP_META.call_id]: call_id, [MCP_META.key]: req.key, [MCP_META.turn]: req.turn };
    if (req.create_kwargs && Object.keys(req.create_kwargs).length > 0) meta[MCP_META.create_kwargs] = req.create_kwargs;
    if (req.sandbox) {
      meta[MCP_META.sandbox_id] = req.sandbox.sandbox_id;
      meta[MCP_META.lease_id] = req.sandbox.lease_id;
    }
    const server = entry.server;
    let created: { task_id: string; attempts: number } | undefined;
    for (let attempts = 1; ; attempts++) {
      let client: Client | undefined;
      try {
        client = await server.open();
        if (entry.task) {
          // Task-augmented: the server answers at once with the task it created; the result is polled for.
          const r = await client.request({ method: "tools/call", params: { name: req.name, arguments: req.arguments as Record<string, unknown>, _meta: meta } }, CreateTaskResultSchema, {
            timeout: server.spec.timeout_ms,
            // Kept a request's timeout past the wait's bound, so that the wait's last poll still finds it.
            task: { ttl: (server.spec.task_timeout_ms ?? DEFAULT_TASK_TIMEOUT_MS) + server.spec.timeout_ms },
            ...(req.signal ? { signal: req.signal } : {}),
          });
          created = { task_id: r.task.taskId, attempts };
          break;
        }
        const result = await client.callTool({ name: req.name, arguments: req.arguments as Record<string, unknown>, _meta: meta }, undefined, {
          timeout: server.spec.timeout_ms,
          ...(req.signal ? { signal: req.signal } : {}),
        });
        return toObservation(req.name, result as CallToolResult, call_id, attempts, server.maxReplyBytes);
      } catch (e) {
        if (req.signal?.aborted) return fail("aborted", attempts);
        const f = describe(e, server);
        if (f.reset && client) server.reset(client);
        const again = f.unsent === true || (f.transient && entry.idempotent);
        if (!again || attempts > server.spec.max_retries) {
          const n = f.transient ? ` (${attempts} attempt${attempts > 1 ? "s" : ""})` : "";
          return fail(`${f.reason}${n}`, attempts);
        }
        await backoff(attempts, this.opts, req.signal);
      }
    }
    const { task_id, attempts } = created;
    const timeout_ms = server.spec.task_timeout_ms ?? DEFAULT_TASK_TIMEOUT_MS;
    if (req.deferTasks) {
      return { ok: false, pending: true, call_id, attempts, task_id, timeout_ms, content: `Error executing tool '${req.name}': it runs as MCP task '${task_id}', whose result this loop cannot wait for` };
    }
    const r = await this.awaitTask({ name: req.name, call_id, task_id, within_ms: timeout_ms, timeout_ms, ...(req.signal ? { signal: req.signal } : {}) });
    return { ...r, attempts };
  }

  /**
   * Waits for the result of the call `call_id` running as MCP task `task_id`
   * (see {@link MCP_TASKS_REVISION}): polls `tasks/get` every `pollInterval`
   * the server names (default 1000 ms, at least 10 ms) for at most `within_ms`,
   * then reads `tasks/result` once the task is `completed` and maps it as a
   * plain call's result. The call itself is never sent again. Each poll is a
   * read: it is retried after a timeout, a lost connection or a forgotten
   * session (`max_retries`, backoff as for calls), whatever the tool's hints.
   * Error observations: an unknown or expired task (`-32602`), a `failed`
   * task (its result's text or status message), a `cancelled` one, one that
   * asks for `input_required` (edgeloop answers no elicitation or sampling;
   * it is cancelled), and no result within `within_ms` (`no task result
   * within <timeout_ms> ms`; the task is cancelled where the server offers
   * `tasks.cancel`). Never throws.
   */
  async awaitTask(req: ToolTaskWait): Promise<ToolResult> {
    const fail = (reason: string): ToolResult => ({ ok: false, call_id: req.call_id, attempts: 1, content: `Error executing tool '${req.name}': ${reason}` });
    const entry = this.byName.get(req.name);
    if (!entry) return fail(`no MCP server offers it to wait for task '${req.task_id}'`);
    const server = entry.server;
    const task = `MCP task '${req.task_id}'`;
    const end = Date.now() + req.within_ms;
    const options = () => ({ timeout: server.spec.timeout_ms, ...(req.signal ? { signal: req.signal } : {}) });
    for (;;) {
      if (req.signal?.aborted) return fail("aborted");
      if (Date.now() >= end) {
        await this.cancelTask(server, req.task_id);
        return fail(`no task result within ${req.timeout_ms} ms (${task})`);
      }
      const got = await this.read(server, req, (client) => client.experimental.tasks.getTask(req.task_id, options()));
      if ("failure" in got) return fail(got.failure);
      const t: GetTaskResult = got.value;
      const why = t.statusMessage ? `: ${t.statusMessage}` : "";
      switch (t.status) {
        case "completed":
        case "failed": {
          const res = await this.read(server, req, (client) => client.experimental.tasks.getTaskResult(req.task_id, CallToolResultSchema, options()));
          if ("failure" in res) return fail(t.status === "failed" ? `${task} failed (${res.failure})` : res.failure);
          const obs = toObservation(req.name, res.value as CallToolResult, req.call_id, 1, server.maxReplyBytes);
          if (t.status === "failed" && obs.ok) return fail(`${task} failed${why || (obs.content ? `: ${obs.content}` : "")}`);
          return obs;
        }
        case "cancelled":
          return fail(`${task} was cancelled${why}`);
        case "input_required":
          await this.cancelTask(server, req.task_id);
          return fail(`${task} asks for input (input_required), which edgeloop cannot give; it was cancelled`);
        default: {
          const wait = Math.min(Math.max(t.pollInterval ?? DEFAULT_POLL_MS, MIN_POLL_MS), Math.max(0, end - Date.now()));
          await sleepUnlessAborted(wait, req.signal);
        }
      }
    }
  }

  /**
   * One read of a task (`tasks/get`, `tasks/result`), retried after a transient failure; an unknown or expired
   * task (`-32602`, the spec's answer for a task id the server does not hold) fails at once, naming the task.
   */
  private async read<T>(server: McpConnection, req: ToolTaskWait, send: (client: Client) => Promise<T>): Promise<{ value: T } | { failure: string }> {
    for (let attempts = 1; ; attempts++) {
      let client: Client | undefined;
      try {
        client = await server.open();
        return { value: await send(client) };
      } catch (e) {
        if (req.signal?.aborted) return { failure: "aborted" };
        if (e instanceof McpError && e.code === ErrorCode.InvalidParams) {
          return { failure: `${server.label} does not know MCP task '${req.task_id}' (unknown or expired: ${e.message.replace(/^(MCP error -?\d+: )+/, "")})` };
        }
        const f = describe(e, server);
        if (f.reset && client) server.reset(client);
        if (!(f.transient || f.unsent === true) || attempts > server.spec.max_retries) {
          return { failure: `${f.reason}${f.transient ? ` (${attempts} attempt${attempts > 1 ? "s" : ""})` : ""} while polling MCP task '${req.task_id}'` };
        }
        await backoff(attempts, this.opts, req.signal);
      }
    }
  }

  /** Asks the server to cancel a task it no longer needs to run (when it offers `tasks.cancel`); failures are ignored. */
  private async cancelTask(server: McpConnection, taskId: string): Promise<void> {
    try {
      const client = await server.open();
      if (client.getServerCapabilities()?.tasks?.cancel === undefined) return;
      await client.experimental.tasks.cancelTask(taskId, { timeout: server.spec.timeout_ms });
    } catch {
      // Best effort: the task ends by its ttl anyway.
    }
  }
}

/** Opens `c`, lists its tools (retried like every idempotent request) and keeps the allow-listed ones. */
async function listServerTools(c: McpConnection, i: number, opts: McpConnectOptions): Promise<McpToolEntry[]> {
  const spec = c.spec;
  const where = spec.url !== undefined ? `${c.label} (${redactUrl(spec.url)})` : `${c.label} (${spec.command})`;
  const tools: { name: string; description?: string; inputSchema: unknown; annotations?: { readOnlyHint?: boolean; idempotentHint?: boolean }; execution?: { taskSupport?: string } }[] = [];
  let taskCalls = false;
  for (let attempts = 1; ; attempts++) {
    let client: Client | undefined;
    try {
      client = await c.open();
      tools.length = 0;
      let cursor: string | undefined;
      for (let page = 0; ; page++) {
        if (page === MAX_LIST_PAGES) throw new ToolError(`${where}: tools/list gave more than ${MAX_LIST_PAGES} pages`, { retryable: false });
        const r = await client.listTools(cursor === undefined ? {} : { cursor }, { timeout: spec.timeout_ms });
        tools.push(...r.tools);
        cursor = r.nextCursor;
        if (cursor === undefined) break;
      }
      taskCalls = client.getServerCapabilities()?.tasks?.requests?.tools?.call !== undefined;
      break;
    } catch (e) {
      if (e instanceof ToolError) throw e;
      const f = describe(e, c);
      if (f.reset && client) c.reset(client);
      if (!f.transient || attempts > spec.max_retries) {
        throw new ToolError(`${where}: cannot list its tools: ${f.reason}${f.transient ? ` (${attempts} attempt${attempts > 1 ? "s" : ""})` : ""}`, { retryable: false, cause: e });
      }
      await backoff(attempts, opts);
    }
  }
  const listedNames = tools.map((t) => t.name);
  if (spec.tools) {
    const missing = spec.tools.filter((n) => !listedNames.includes(n));
    if (missing.length > 0) throw new ConfigError(`mcp_servers[${i}].tools`, `${c.label} lists no tool ${missing.map((m) => `'${m}'`).join(", ")}; it lists ${pyList(listedNames)}`);
  }
  const keep = spec.tools ? new Set(spec.tools) : undefined;
  const kept = tools.filter((t) => !keep || keep.has(t.name));
  const seen = new Set<string>();
  for (const t of kept) {
    // MCP's tool-name rule (spec 2025-11-25, Tools › Tool names: 1–128 characters of A–Z, a–z, 0–9, _, -, .): a name is
    // rendered into the prompt and parsed back from model text, so a name outside it (`</tools>`, spaces) is refused.
    if (!MCP_TOOL_NAME.test(t.name)) {
      throw new ConfigError(`mcp_servers[${i}]`, `${c.label} lists a tool named ${JSON.stringify(t.name.length > 140 ? `${t.name.slice(0, 140)}…` : t.name)}, outside MCP's tool-name rule (1–128 characters of A–Z a–z 0–9 _ - .); leave it out with the server's tools allow-list`);
    }
    if (seen.has(t.name)) throw new ConfigError(`mcp_servers[${i}]`, `${c.label} lists the tool '${t.name}' twice; a server's tool names must be unique`);
    seen.add(t.name);
    if (t.execution?.taskSupport === "required" && !taskCalls) {
      throw new ConfigError(`mcp_servers[${i}]`, `${c.label}: tool '${t.name}' requires running as a task (execution.taskSupport 'required') but the server does not offer tasks for tools/call (capability tasks.requests.tools.call); leave it out with the server's tools allow-list`);
    }
    if (t.execution?.taskSupport === "required" && (spec.tasks ?? "auto") === "never") {
      throw new ConfigError(`mcp_servers[${i}].tasks`, `${c.label}: tool '${t.name}' requires running as a task (execution.taskSupport 'required'); set tasks to auto or always, or leave the tool out with the server's tools allow-list`);
    }
  }
  return kept
    .map((t) => {
      const schema = ToolSchema.safeParse({ type: "function", function: { name: t.name, description: t.description ?? "", parameters: t.inputSchema } });
      if (!schema.success) throw new ConfigError(`mcp_servers[${i}]`, `${c.label}: tool '${t.name}' has an inputSchema edgeloop cannot offer (${schema.error.issues[0]?.path.join(".")}: ${schema.error.issues[0]?.message})`);
      const support = t.execution?.taskSupport;
      const task = taskCalls && (support === "required" || (support === "optional" && spec.tasks === "always"));
      return { name: t.name, schema: schema.data, server: c, idempotent: t.annotations?.readOnlyHint === true || t.annotations?.idempotentHint === true, task };
    });
}

/** A `tools/call` result as the observation the model reads. */
function toObservation(name: string, result: CallToolResult, call_id: string, attempts: number, maxBytes: number): ToolResult {
  const fail = (reason: string): ToolResult => ({ ok: false, call_id, attempts, content: `Error executing tool '${name}': ${reason}` });
  const texts: string[] = [];
  const parts: ToolContentPart[] = [];
  let images = 0;
  let size = 0;
  for (const part of result.content ?? []) {
    if (part.type === "image") {
      // MCP ImageContent {type: "image", data: base64, mimeType} (spec: Server › Tools › Tool result › Image content), as a data URI part.
      parts.push({ type: "image", image: `data:${part.mimeType};base64,${part.data}` });
      size += part.data.length;
      images++;
      continue;
    }
    if (part.type !== "text") return fail(`the result holds a content part of type '${part.type}'; edgeloop passes text, image and structured content only`);
    texts.push(part.text);
    parts.push({ type: "text", text: part.text });
  }
  let content = texts.join("\n");
  if (images > 0 && size > maxBytes) return fail(`the reply is larger than ${maxBytes} bytes (the server's max_reply_bytes)`);
  if (texts.length === 0 && result.structuredContent !== undefined) content = JSON.stringify(result.structuredContent);
  // The HTTP transport caps the reply as it streams; stdio replies are measured once read.
  if (content.length > maxBytes / 4 && new TextEncoder().encode(content).byteLength > maxBytes) return fail(`the reply is larger than ${maxBytes} bytes (the server's max_reply_bytes)`);
  if (result.isError === true) return fail(content || "the tool reported an error (isError) with no text");
  return { ok: true, call_id, attempts, content, ...(images > 0 ? { parts } : {}) };
}

/** Why an SDK request failed. */
function describe(e: unknown, c: McpConnection): Failure {
  const spec = c.spec;
  // A transport that closed itself for a reason of its own (its newest one): that reason, whatever the SDK then
  // reported (ConnectionClosed, "Not connected"), and no retry: the server misbehaves, the next call reconnects.
  if (c.closeReason !== undefined) return { reason: `${c.label} was disconnected: ${c.closeReason}`, transient: false, reset: true };
  if (e instanceof McpError) {
    const kind = (e.data as { edgeloop_failure?: HttpFailure } | undefined)?.edgeloop_failure;
    if (kind === "timeout" || e.code === ErrorCode.RequestTimeout) return { reason: `timed out after ${spec.timeout_ms} ms`, transient: true, reset: false };
    if (kind === "too_large") return { reason: `the reply is larger than ${c.maxReplyBytes} bytes (the server's max_reply_bytes)`, transient: false, reset: false };
    if (kind === "redirect") return { reason: `${c.label} answered a redirect (redirects are not followed)`, transient: false, reset: false };
    // Refused, or reset before the reply's headers (a server dying mid-call): the fetch cannot tell which.
    if (kind === "connection") return { reason: `the connection to ${c.label} failed before a reply`, transient: true, reset: true };
    if (kind === "lost" || e.code === ErrorCode.ConnectionClosed) return { reason: `${c.label} closed the connection before answering`, transient: true, reset: true };
    return { reason: e.message, transient: false, reset: false };
  }
  if (e instanceof StreamableHTTPError) {
    const status = e.code ?? 0;
    // 404: the server forgot the session (restarted, or expired it) and ran nothing; a new session is opened.
    if (status === 404) return { reason: `${c.label} no longer knows the session (HTTP 404)`, transient: true, reset: true, unsent: true };
    // -1: the SDK's "Unexpected content type" (an HTML page, a plain-text 200): not an MCP endpoint; not retried.
    if (status <= 0) return { reason: `${c.label} is not an MCP Streamable HTTP endpoint (${e.message.replace(/^Streamable HTTP error: /, "")})`, transient: false, reset: true };
    return { reason: `${c.label}: HTTP ${status}`, transient: status >= 500 || status === 408 || status === 429, reset: false };
  }
  // zod's error for a message that is not JSON-RPC, or a result (a tool list) that breaks MCP's schema; JSON.parse's
  // error for a body that is not JSON. The server answered: the same answer would come again, so no retry.
  const issues = (e as { issues?: { path?: (string | number)[]; message?: string }[] })?.issues;
  if (Array.isArray(issues)) {
    const first = issues[0];
    const at = first?.path?.length ? first.path.join(".") : "(root)";
    return { reason: `${c.label} answered with a message that is not valid MCP (${issues.length} problem${issues.length === 1 ? "" : "s"}; first at ${at}: ${first?.message ?? "invalid"})`, transient: false, reset: true };
  }
  if (e instanceof SyntaxError) return { reason: `${c.label} answered with something that is not JSON (${e.message})`, transient: false, reset: true };
  // A failed notification, a transport or spawn error (a stdio command that does not start).
  return { reason: `could not connect to ${c.label} (${(e as Error)?.message ?? String(e)})`, transient: true, reset: true };
}

/** Waits before retry `attempt` (1-based): min·2^(attempt-1), at most max; an abort cuts it short. */
function backoff(attempt: number, opts: McpConnectOptions, signal?: AbortSignal): Promise<void> {
  return sleepUnlessAborted(Math.min((opts.retryMinTimeoutMs ?? 250) * 2 ** (attempt - 1), opts.retryMaxTimeoutMs ?? 5000), signal);
}

/** The JSON-RPC id of a request body, or undefined for a notification, a response or a batch. */
function requestIdOf(body: unknown): string | number | undefined {
  if (typeof body !== "string") return undefined;
  try {
    const m = JSON.parse(body) as { id?: unknown; method?: unknown };
    return typeof m.method === "string" && (typeof m.id === "string" || typeof m.id === "number") ? m.id : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The `data` of each `message` event of a whole SSE body (events split on a
 * blank line; `data:` lines joined by `"\n"`; comments, ids, `retry` and other
 * event types skipped), in order.
 * @see https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
 */
export function sseMessages(body: string): string[] {
  const out: string[] = [];
  let data: string[] = [];
  let event = "";
  const dispatch = () => {
    if (data.length > 0 && (event === "" || event === "message")) out.push(data.join("\n"));
    data = [];
    event = "";
  };
  for (const line of body.split(/\r\n|\r|\n/)) {
    if (line === "") {
      dispatch();
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") event = value;
  }
  dispatch();
  return out.filter((d) => d.trim() !== "");
}

/**
 * The SDK's Streamable HTTP transport over a bounded fetch, by the rules of
 * shared/http/outbound.ts: every POST has the deadline `timeout_ms`, its reply
 * is read whole under `max_reply_bytes` ({@link readTextCapped}), redirects are
 * not followed; when one carrying a request fails,
 * the transport is handed a JSON-RPC error answer for that request
 * (`data.edgeloop_failure` the kind), so the pending SDK request ends at
 * once — a server dying mid-stream would otherwise leave it to its timeout.
 * The standalone GET stream (server notifications) is not opened: edgeloop
 * lists tools once and uses no notifications.
 */
function httpTransport(spec: McpServerSpec, base?: OutboundFetch): Transport {
  const url = spec.url!;
  const what = `MCP server '${spec.name}' (${redactUrl(url)})`;
  const maxReplyBytes = spec.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES;
  const bounded = async (input: string | URL, init?: RequestInit): Promise<Response> => {
    const method = init?.method ?? "GET";
    if (method === "GET") return new Response(null, { status: 405 });
    const id = requestIdOf(init?.body);
    const failed = (kind: HttpFailure, message: string, cause?: unknown): Response => {
      if (id === undefined) throw new ToolError(`${what}: ${message}`, { cause });
      const code = kind === "timeout" ? ErrorCode.RequestTimeout : ErrorCode.ConnectionClosed;
      return Response.json({ jsonrpc: "2.0", id, error: { code, message: `${what}: ${message}`, data: { edgeloop_failure: kind } } });
    };
    const deadline = AbortSignal.timeout(spec.timeout_ms);
    // Our own controller, so that a refused reply (a redirect, the cap) also closes the connection.
    const own = new AbortController();
    const signal = AbortSignal.any([deadline, own.signal]);
    // The transport's own signal (init.signal, aborted by its close()) is not used: it belongs to whichever
    // request opened the connection, and Workers refuse to touch another request's (or Durable Object's)
    // signal. A request in flight at close() ends by its deadline; the SDK has already failed its caller.
    let answered = false;
    try {
      const res = await (base ?? fetch)(String(input), { method, headers: init?.headers ?? {}, body: init?.body ?? null, signal, redirect: "manual" });
      answered = true;
      if ((res.status >= 300 && res.status < 400) || res.type === "opaqueredirect") {
        own.abort();
        await res.body?.cancel().catch(() => undefined);
        return failed("redirect", `answered HTTP ${res.status} (a redirect; redirects are not followed)`);
      }
      const text = await readTextCapped(res, maxReplyBytes, what);
      const headers = new Headers(res.headers);
      headers.delete("content-length");
      headers.delete("content-encoding");
      const empty = text === "" || res.status === 204 || res.status === 205 || res.status === 304;
      if (!empty && res.ok && headers.get("content-type")?.startsWith("text/event-stream")) {
        // The stream is read whole already: its messages go to the transport as one JSON batch, which it
        // takes as it takes a JSON reply (cheaper than its stream pipeline; nothing is waiting on it).
        headers.set("content-type", "application/json");
        return new Response(`[${sseMessages(text).join(",")}]`, { status: res.status, headers });
      }
      return new Response(empty ? null : text, { status: res.status, headers });
    } catch (e) {
      own.abort();
      if (e instanceof OutboundHttpError && e.kind === "too_large") return failed("too_large", `reply larger than ${maxReplyBytes} bytes`, e);
      if (deadline.aborted) return failed("timeout", `timed out after ${spec.timeout_ms} ms`, e);
      return failed(answered ? "lost" : "connection", answered ? "the connection closed before the reply ended" : "could not connect", e);
    }
  };
  return new StreamableHTTPClientTransport(new URL(url), {
    fetch: bounded,
    ...(spec.headers ? { requestInit: { headers: spec.headers } } : {}),
  });
}
