import { z } from "zod";
import { ToolResultCallback } from "../../shared/session/tool-result-callback.ts";
import { InteractionReply, InteractionRequestBody } from "../../shared/tools/interaction-client.ts";
import { ToolCallRequestBody, ToolReply } from "../../shared/tools/webhook-tool-client.ts";

/**
 * The JSON Schemas (draft 2020-12) of the tool and simulated-user webhooks,
 * generated from their zod types with zod v4's `z.toJSONSchema`, by file name
 * under `docs/schemas/`. What edgeloop sends is described as it is sent
 * (`io: "output"`); what it accepts, as it may be written (`io: "input"`:
 * optional and nullable fields as such). docs/tool-webhooks.md explains them;
 * `bun infra/tools/write-schemas.ts` writes them and
 * tests/tools/wire-schemas.test.ts checks the committed files equal these.
 * @see https://zod.dev/json-schema (z.toJSONSchema, the `io` option)
 */
export function webhookJsonSchemas(): Record<string, Record<string, unknown>> {
  const gen = (type: z.ZodType, io: "input" | "output", title: string, description: string): Record<string, unknown> => ({
    ...(z.toJSONSchema(type, { io, target: "draft-2020-12" }) as Record<string, unknown>),
    title,
    description,
  });
  return {
    "tool-call-request.json": gen(ToolCallRequestBody, "output", "edgeloop tool call", "The body edgeloop POSTs to a webhook tool (docs/tool-webhooks.md)."),
    "tool-reply.json": gen(ToolReply, "input", "edgeloop tool reply", "The body a webhook tool answers with HTTP 200 (docs/tool-webhooks.md)."),
    "tool-result-callback.json": gen(
      ToolResultCallback,
      "input",
      "edgeloop tool-result callback",
      "The body of POST /v1/sessions/{key}/tool-results, the result of a call the tool answered 202 (docs/tool-webhooks.md).",
    ),
    "interaction-request.json": gen(InteractionRequestBody, "output", "edgeloop simulated-user request", "The body edgeloop POSTs to a simulated user (docs/tool-webhooks.md)."),
    "interaction-reply.json": gen(InteractionReply, "input", "edgeloop simulated-user reply", "The body a simulated user answers with HTTP 200 (docs/tool-webhooks.md)."),
  };
}
