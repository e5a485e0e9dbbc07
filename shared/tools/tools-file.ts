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
  // `{name}` placeholders are filled from `vars`; one left over (no such var: a user's own file) is refused
  // naming its field, whether it would make the URL invalid (`{port}` in the authority) or not (`/{port}/c`
  // would pass as a path and fail every call at run time).
  const fill = (url: string, path: string): string => {
    const filled = url.replace(/\{(\w+)\}/g, (m, k: string) => (opts.vars && k in opts.vars ? String(opts.vars[k]) : m));
    const left = /\{(\w+)\}/.exec(filled);
    if (left) throw new ConfigError(`${source}: ${path}`, `placeholder ${left[0]} is not filled (placeholders are filled only in the example servers' files; write the URL out)`);
    return filled;
  };
  for (const list of ["tools", "interactions", "mcp_servers"] as const) {
    const entries = doc && typeof doc === "object" ? (doc as Record<string, unknown>)[list] : undefined;
    if (!Array.isArray(entries)) continue;
    entries.forEach((t, i) => {
      if (t && typeof t === "object" && typeof (t as { url?: unknown }).url === "string") {
        const entry = t as { url: string };
        entry.url = fill(entry.url, `${list}[${i}].url`);
      }
    });
  }
  const sandbox = doc && typeof doc === "object" ? (doc as Record<string, unknown>).sandbox : undefined;
  if (sandbox && typeof sandbox === "object") {
    const sb = sandbox as Record<string, unknown>;
    for (const k of ["create_url", "release_url", "heartbeat_url"]) {
      const v = sb[k];
      if (typeof v === "string") sb[k] = fill(v, `sandbox.${k}`);
    }
  }
  const r = ToolsFile.safeParse(doc);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new ConfigError(`${source}: ${formatPath("", issue.path) || "(root)"}`, issue.message);
  }
  return r.data;
}
