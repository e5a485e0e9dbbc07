import { parse as parseYaml } from "yaml";
import { ConfigError, formatPath } from "../errors.ts";
import { ToolsFile } from "../schema/index.ts";

/** Options for {@link parseToolsFile}. */
export interface ParseToolsFileOptions {
  /** Name used in error messages (the file path). */
  source?: string;
  /** Values for `{name}` placeholders in tool URLs, e.g. `{port: 8123}` for `http://127.0.0.1:{port}/tools/calc`. */
  vars?: Record<string, string | number>;
}

/**
 * Parses and validates a tools file, YAML or JSON text:
 * `tools: [{name, url, schema (OpenAI function format), timeout_ms, max_retries}]`
 * and, optionally, `interactions: [{name, url, timeout_ms, max_retries}]`
 * (simulated users) and `mcp_servers: [{name, url | command+args+env, …}]`
 * (docs/tool-webhooks.md).
 * `{name}` placeholders in tool, interaction, MCP server and sandbox URLs are filled from `vars` before validation.
 * @throws ConfigError naming the file and the failing path (e.g. `tools[1].url`),
 *   for bad syntax, a schema mismatch, duplicate names, or an unfilled placeholder.
 */
export function parseToolsFile(text: string, opts: ParseToolsFileOptions = {}): ToolsFile {
  const source = opts.source ?? "tools file";
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (e) {
    throw new ConfigError(source, `not valid YAML or JSON: ${(e as Error).message}`, { cause: e });
  }
  for (const list of ["tools", "interactions", "mcp_servers"] as const) {
    const entries = doc && typeof doc === "object" ? (doc as Record<string, unknown>)[list] : undefined;
    if (!Array.isArray(entries)) continue;
    for (const t of entries) {
      if (t && typeof t === "object" && typeof (t as { url?: unknown }).url === "string") {
        const entry = t as { url: string };
        entry.url = entry.url.replace(/\{(\w+)\}/g, (m, k: string) => (opts.vars && k in opts.vars ? String(opts.vars[k]) : m));
      }
    }
  }
  const sandbox = doc && typeof doc === "object" ? (doc as Record<string, unknown>).sandbox : undefined;
  if (sandbox && typeof sandbox === "object") {
    const sb = sandbox as Record<string, unknown>;
    for (const k of ["create_url", "release_url", "heartbeat_url"]) {
      const v = sb[k];
      if (typeof v === "string") sb[k] = v.replace(/\{(\w+)\}/g, (m, name: string) => (opts.vars && name in opts.vars ? String(opts.vars[name]) : m));
    }
  }
  const r = ToolsFile.safeParse(doc);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new ConfigError(`${source}: ${formatPath("", issue.path) || "(root)"}`, issue.message);
  }
  return r.data;
}
