import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { SCHEMAS_DIR, schemaFileText } from "../../infra/tools/write-schemas.ts";
import { ToolResultCallback } from "../../shared/session/tool-result-callback.ts";
import { InteractionReply, InteractionRequestBody } from "../../shared/tools/interaction-client.ts";
import { ToolCallRequestBody, ToolReply } from "../../shared/tools/webhook-tool-client.ts";
import { webhookJsonSchemas } from "../../infra/tools/wire-schemas.ts";

const ROOT = join(import.meta.dir, "..", "..");
const DOC = readFileSync(join(ROOT, "docs", "tool-webhooks.md"), "utf8");

test("docs/schemas/ holds exactly the schemas generated from the zod types, byte for byte", () => {
  const generated = webhookJsonSchemas();
  expect(readdirSync(SCHEMAS_DIR).sort()).toEqual(Object.keys(generated).sort());
  for (const [name, schema] of Object.entries(generated)) {
    expect({ name, text: readFileSync(join(SCHEMAS_DIR, name), "utf8") }).toEqual({ name, text: schemaFileText(schema) });
  }
});

test("the generated schemas say what the zod types enforce (required fields, types)", () => {
  const s = webhookJsonSchemas();
  expect(s["tool-call-request.json"]!.required).toEqual(["call_id", "name", "arguments", "key", "turn", "create_kwargs"]);
  expect(s["tool-reply.json"]!.required).toEqual(["content"]);
  expect((s["tool-reply.json"]!.properties as Record<string, unknown>).reward).toEqual({ type: ["number", "null"] });
  expect(s["tool-result-callback.json"]!.required).toEqual(["call_id", "content"]);
  expect(s["interaction-request.json"]!.required).toEqual(["key", "turn", "messages", "interaction_kwargs"]);
  expect(s["interaction-reply.json"]!.required).toEqual(["terminate", "content"]);
});

// Every example body in docs/tool-webhooks.md is fenced as ```json <schema-file>: each must parse under its zod type,
// and every schema file is linked from the doc.
const TYPES = {
  "tool-call-request.json": ToolCallRequestBody,
  "tool-reply.json": ToolReply,
  "tool-result-callback.json": ToolResultCallback,
  "interaction-request.json": InteractionRequestBody,
  "interaction-reply.json": InteractionReply,
} as const;

test("each example body in docs/tool-webhooks.md is valid under its type; each schema is linked", () => {
  const blocks = [...DOC.matchAll(/```json ([a-z-]+\.json)\n([\s\S]*?)```/g)].map((m) => [m[1]!, m[2]!] as const);
  expect(new Set(blocks.map(([n]) => n))).toEqual(new Set(Object.keys(TYPES)));
  for (const [name, text] of blocks) {
    const r = TYPES[name as keyof typeof TYPES].safeParse(JSON.parse(text));
    expect({ name, ok: r.success, issues: r.success ? [] : r.error.issues }).toEqual({ name, ok: true, issues: [] });
  }
  for (const name of Object.keys(TYPES)) expect(DOC).toContain(`(schemas/${name})`);
});
