import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The package root (where examples/ and infra/ live). */
export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** The scripted policy the simulated engine runs when no `--script` is given: the example data's. */
export const DEFAULT_SCRIPT = join(PACKAGE_ROOT, "examples", "policy.json");
