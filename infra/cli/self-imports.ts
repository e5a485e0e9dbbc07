import { plugin } from "bun";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository (package) root: two levels above this file. */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/**
 * Lets modules the CLI imports at run time — agent loops named by
 * `agent_loop_config_path`, wherever they live — import edgeloop itself as
 * `edgeloop/shared/...` (or `edgeloop/infra/...`, `edgeloop/functions/...`):
 * a Bun runtime plugin resolving the bare specifier `edgeloop/<path>` to
 * `<this package>/<path>`. Without it, a loop file outside a project that
 * has edgeloop in its `node_modules` fails with `Cannot find package
 * 'edgeloop'`. The same loop is the same class instance as the CLI's own
 * (one module graph), so `instanceof AgentLoop` holds.
 * @see https://bun.sh/docs/runtime/plugins (onResolve)
 */
export function registerSelfImports(): void {
  plugin({
    name: "edgeloop-self-imports",
    setup(build) {
      build.onResolve({ filter: /^edgeloop(\/.*)?$/ }, (args) => ({ path: join(ROOT, args.path.slice("edgeloop".length) || "package.json") }));
    },
  });
}
