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
 * `tools: [{name, url, schema (OpenAI function format), timeout_ms, max_retries}]`.
 * `{name}` placeholders in URLs are filled from `vars` before validation.
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
  if (doc && typeof doc === "object" && Array.isArray((doc as { tools?: unknown }).tools)) {
    for (const t of (doc as { tools: unknown[] }).tools) {
      if (t && typeof t === "object" && typeof (t as { url?: unknown }).url === "string") {
        const tool = t as { url: string };
        tool.url = tool.url.replace(/\{(\w+)\}/g, (m, k: string) => (opts.vars && k in opts.vars ? String(opts.vars[k]) : m));
      }
    }
  }
  const r = ToolsFile.safeParse(doc);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new ConfigError(`${source}: ${formatPath("", issue.path) || "(root)"}`, issue.message);
  }
  return r.data;
}
