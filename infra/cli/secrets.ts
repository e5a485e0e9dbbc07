import { readFileSync } from "node:fs";
import { InputError } from "../../shared/errors.ts";

/**
 * A secret from the environment, so it stays out of `ps`, `/proc/<pid>/cmdline`
 * and shell history: `env[name]` when set and non-empty, else the contents of
 * the file named by `env[name + "_FILE"]` (a mounted Kubernetes or Docker
 * secret) with one trailing newline dropped; null when neither is set.
 * @throws InputError naming the variable when both are set, when the file
 *   cannot be read, or when it is empty.
 */
export function secretFromEnv(name: string, env: Record<string, string | undefined> = process.env): string | null {
  const direct = env[name] || null;
  const file = env[`${name}_FILE`] || null;
  if (direct && file) throw new InputError(name, `set either ${name} or ${name}_FILE, not both`);
  if (direct) return direct;
  if (!file) return null;
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new InputError(`${name}_FILE`, `cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  const secret = text.replace(/\r?\n$/, "");
  if (!/\S/.test(secret)) throw new InputError(`${name}_FILE`, `${file} is empty`);
  return secret;
}
