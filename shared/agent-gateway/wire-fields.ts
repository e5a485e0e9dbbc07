import { z } from "zod";
import type { ChatMessage } from "../schema/message.ts";
import { inputErrorFromZod } from "../errors.ts";

/** Small readers shared by the agent gateway's request parsers (chat completions, Responses, Messages). */

/** A string field (`expected a string` otherwise): built once, not per message (a schema costs more to build than to run). */
export const StringField = z.string({ error: "expected a string" });

/**
 * The request path of each image part a wire parser made (`messages[0].content[1].source.data`,
 * `input[2].output[0].image_url`, …), so that an error about the image, and the record's
 * `multi_modal.images[i].field`, name it as the agent sent it (the gateway's chat messages are
 * numbered otherwise: Anthropic's `system`, tool results split out).
 */
export const IMAGE_PART_PATHS = new WeakMap<object, string>();

/** An image content part `{type: "image_url", image_url: {url}}` whose request path is `path` ({@link IMAGE_PART_PATHS}). */
export function imagePart(url: string, path: string): { type: "image_url"; image_url: { url: string } } {
  const part = { type: "image_url" as const, image_url: { url } };
  IMAGE_PART_PATHS.set(part, path);
  return part;
}

/** null and undefined both count as absent in every API the gateway speaks. */
export const nullish = (v: unknown): v is null | undefined => v === null || v === undefined;

/** A plain JSON object (not null, not an array). */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * `value` checked with `schema`.
 * @throws InputError naming `field` (and the path inside it) with zod's message.
 */
export function parseField<S extends z.ZodType>(field: string, schema: S, value: unknown): z.infer<S> {
  const r = schema.safeParse(value);
  if (!r.success) throw inputErrorFromZod(field, r.error.issues);
  return r.data;
}

/** The keys of `ignored` that `body` carries with a non-null value, in the body's order (empty for a non-object body): what `x-edgeloop-ignored-keys` names. */
export function presentKeys(body: unknown, ignored: readonly string[]): string[] {
  if (!isRecord(body)) return [];
  return Object.keys(body).filter((k) => ignored.includes(k) && !nullish(body[k]));
}

/**
 * The first tool result in `messages` that answers no call: a `tool` message
 * whose `tool_call_id` is not among the `tool_calls` of the assistant message
 * before it (only other tool messages may stand between them), or one with
 * no assistant message before it at all. Null when every tool result answers
 * a call. One pass, O(messages + calls). Each API's parser turns a hit into a
 * 400 naming its own field: OpenAI refuses a tool message that follows no
 * `tool_calls` ("messages with role 'tool' must be a response to a preceding
 * message with 'tool_calls'"; Responses: "No tool call found for function
 * call output with call_id …"), Anthropic a `tool_result` whose id matches no
 * `tool_use` of the previous assistant turn. Without the check a broken
 * agent's result would be rendered as an observation of a call the model
 * never made, and trained on.
 */
export function unansweredToolResult(messages: readonly ChatMessage[]): { index: number; id: string } | null {
  let calls: Set<string> | null = null;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    if (m.role === "assistant") calls = new Set((m.tool_calls ?? []).map((c) => c.id ?? ""));
    else if (m.role === "tool") {
      const id = m.tool_call_id ?? "";
      if (!calls || !calls.has(id)) return { index: i, id };
    } else calls = null;
  }
  return null;
}
