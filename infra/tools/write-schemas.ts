import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { webhookJsonSchemas } from "./wire-schemas.ts";

/** `docs/schemas/` of this package. */
export const SCHEMAS_DIR = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "docs", "schemas");

/** The text of one generated schema file: 2-space JSON and a final newline. */
export function schemaFileText(schema: unknown): string {
  return JSON.stringify(schema, null, 2) + "\n";
}

/**
 * Writes the webhook JSON Schemas ({@link webhookJsonSchemas}) to `docs/schemas/`:
 * `bun infra/tools/write-schemas.ts`. Run it after changing a webhook's zod type;
 * tests/tools/wire-schemas.test.ts fails until the committed files match.
 */
export function writeSchemas(dir = SCHEMAS_DIR): string[] {
  mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  for (const [name, schema] of Object.entries(webhookJsonSchemas())) {
    writeFileSync(join(dir, name), schemaFileText(schema));
    written.push(join(dir, name));
  }
  return written;
}

if (import.meta.main) for (const f of writeSchemas()) console.log(`wrote ${f}`);
