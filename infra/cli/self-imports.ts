import { plugin } from "bun";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository (package) root: two levels above this file. */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/**
 * Where `edgeloop` or `edgeloop/<entry>` resolves through `exports` (a
 * `package.json` exports map of plain subpaths, as edgeloop's is): the
 * target file under `root`, or null for a subpath the map does not name
 * (edgeloop's internals are not importable, as under `node_modules`).
 */
export function resolveSelfImport(specifier: string, exports: Record<string, string>, root: string = ROOT): string | null {
  const sub = specifier === "edgeloop" ? "." : `.${specifier.slice("edgeloop".length)}`;
  const target = exports[sub];
  return typeof target === "string" ? join(root, target) : null;
}

/** `edgeloop` / `edgeloop/<entry>` as a module specifier of an import, export or dynamic import (quotes kept apart). */
const SELF_SPECIFIER = /((?:\bfrom|\bimport)\s*\(?\s*)(["'])(edgeloop(?:\/[^"'\s]*)?)\2/g;

/** The importable entry points of `exports`, as specifiers (`edgeloop/agent-loop, …`; package.json left out). */
function entryNames(exports: Record<string, string>): string {
  return Object.keys(exports)
    .filter((k) => k !== "./package.json")
    .map((k) => `edgeloop${k.slice(1)}`)
    .join(", ");
}

/**
 * `source` with every `edgeloop` / `edgeloop/<entry>` import specifier
 * replaced by the absolute path of its entry file (`exports`); one pass,
 * linear. @throws Error naming the entry points for a subpath `exports`
 * does not name.
 */
export function rewriteSelfImports(source: string, exports: Record<string, string>, root: string = ROOT): string {
  return source.replace(SELF_SPECIFIER, (_m, head: string, q: string, spec: string) => {
    const path = resolveSelfImport(spec, exports, root);
    if (!path) throw new Error(`'${spec}' is not an entry point of edgeloop (package.json exports): import one of ${entryNames(exports)}`);
    return `${head}${q}${path}${q}`;
  });
}

/**
 * Lets modules the CLI imports at run time — agent loops named by
 * `agent_loop_config_path`, wherever they live — import edgeloop itself
 * through its public entry points (`edgeloop/agent-loop`, `edgeloop/schema`,
 * …: `package.json`'s `exports`), as a project with edgeloop in its
 * `node_modules` would; without it, a loop file outside such a project fails
 * with `Cannot find package 'edgeloop'`. A Bun runtime plugin loads each
 * such module (any `.ts`/`.js` file outside this package and outside
 * `node_modules`) with its `edgeloop/<entry>` specifiers rewritten to the
 * entry files' paths: Bun 1.4 runs runtime `onResolve` hooks only for
 * specifiers with a dot (oven-sh/bun#40579), so the specifier is resolved at
 * load instead. The same loop is the same class instance as the CLI's own
 * (one module graph), so `instanceof AgentLoop` holds. A subpath the map
 * does not name fails the import with the list of entry points.
 * @see https://bun.sh/docs/runtime/plugins (onLoad)
 */
export function registerSelfImports(): void {
  const exports = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { exports: Record<string, string> }).exports;
  const escaped = ROOT.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const outside = new RegExp(`^(?!${escaped}/)(?!.*/node_modules/).*\\.(?:[cm]?[jt]s|tsx)$`);
  plugin({
    name: "edgeloop-self-imports",
    setup(build) {
      build.onLoad({ filter: outside }, (args) => {
        const source = readFileSync(args.path, "utf8");
        const loader = /\.tsx$/.test(args.path) ? "tsx" : /\.[cm]?ts$/.test(args.path) ? "ts" : "js";
        return { contents: rewriteSelfImports(source, exports), loader };
      });
    },
  });
}
