import { ConfigError } from "../errors.ts";
import type { ToolSchema } from "../schema/index.ts";
import type { McpToolClient } from "./mcp-tool-client.ts";
import { pyList, type ToolCallRequest, type ToolExecutor, type ToolResult, type ToolTaskWait, type WebhookToolClient } from "./webhook-tool-client.ts";

/** One executor of a {@link CompositeToolExecutor} and how errors name the owner of one of its tools. */
export interface ToolSource {
  executor: ToolExecutor;
  /** E.g. `webhook tool tools[0]` or `MCP server 'math'`. */
  ownerOf(name: string): string;
}

/**
 * Several executors as one (webhook tools and MCP servers, issue 29): the
 * schemas in the sources' order, each call routed to the source offering the
 * tool. An unknown name gets verl's text listing every tool.
 * @throws ConfigError (field `tools`) when two sources offer the same name, naming both owners
 */
export class CompositeToolExecutor implements ToolExecutor {
  readonly schemas: readonly ToolSchema[];
  readonly names: readonly string[];
  private readonly route = new Map<string, ToolExecutor>();

  constructor(private readonly sources: readonly ToolSource[]) {
    const owners = new Map<string, string>();
    for (const s of sources) {
      for (const n of s.executor.names) {
        const other = owners.get(n);
        if (other !== undefined) throw new ConfigError("tools", `tool '${n}' is offered by ${other} and by ${s.ownerOf(n)}; tool names must be unique across webhook tools and MCP servers`);
        owners.set(n, s.ownerOf(n));
        this.route.set(n, s.executor);
      }
    }
    this.schemas = sources.flatMap((s) => s.executor.schemas);
    this.names = sources.flatMap((s) => s.executor.names);
  }

  call(req: ToolCallRequest): Promise<ToolResult> {
    const to = this.route.get(req.name);
    if (!to) return Promise.resolve({ ok: false, call_id: "", attempts: 0, content: `Unknown function '${req.name}'. Available tools: ${pyList(this.names)}` });
    return to.call(req);
  }

  /** Routes the wait to the source offering `req.name`; an error result when it has none or it cannot wait for tasks. */
  awaitTask(req: ToolTaskWait): Promise<ToolResult> {
    const to = this.route.get(req.name);
    if (!to?.awaitTask) return Promise.resolve({ ok: false, call_id: req.call_id, attempts: 0, content: `Error executing tool '${req.name}': no MCP server offers it to wait for task '${req.task_id}'` });
    return to.awaitTask(req);
  }

  select(names: readonly string[]): CompositeToolExecutor {
    return new CompositeToolExecutor(
      this.sources.map((s) => ({
        ownerOf: s.ownerOf,
        executor: s.executor.select ? s.executor.select(names) : s.executor,
      })),
    );
  }
}

/**
 * The tools file's webhook tools and its MCP servers' tools as one executor
 * (webhook tools first); a clash names `webhook tool tools[i]` and
 * `MCP server 'name'`.
 * @throws ConfigError when a name is offered by both
 */
export function webhookAndMcpTools(webhook: WebhookToolClient, mcp: McpToolClient): CompositeToolExecutor {
  return new CompositeToolExecutor([
    { executor: webhook, ownerOf: (n) => `webhook tool tools[${webhook.names.indexOf(n)}]` },
    { executor: mcp, ownerOf: (n) => `MCP server '${mcp.serverOf(n)}'` },
  ]);
}
