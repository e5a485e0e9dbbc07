import { z } from "zod";

/** A text part of a multi-part message content (OpenAI format). */
export const TextPart = z.object({ type: z.literal("text"), text: z.string() });

/**
 * A non-text part (image, video, audio). Parsed so that prompts holding them
 * can be recognised and rejected by the text-only token core (DESIGN §2.5).
 */
export const MediaPart = z.looseObject({
  type: z.enum(["image", "image_url", "video", "video_url", "audio", "input_audio", "audio_url"]),
});

/** Message content: a string, or a list of parts. */
export const MessageContent = z.union([z.string(), z.array(z.union([TextPart, MediaPart], { error: "expected a content part {type: text|image|video|audio, …}" }))], {
  error: "expected a string or a list of content parts",
});

/** One tool call inside an assistant message (OpenAI format); `arguments` may be a JSON string or an object. */
export const ToolCallMessage = z.object({
  id: z.string().optional(),
  type: z.literal("function").default("function"),
  function: z.object({
    name: z.string(),
    arguments: z.union([z.string(), z.record(z.string(), z.unknown())]),
  }),
});
export type ToolCallMessage = z.infer<typeof ToolCallMessage>;

/** A chat message as chat templates expect it (OpenAI chat format, plus `reasoning_content`). */
export const ChatMessage = z.object({
  role: z.enum(["system", "user", "assistant", "tool"]),
  content: MessageContent.nullable().default(""),
  tool_calls: z.array(ToolCallMessage).optional(),
  tool_call_id: z.string().optional(),
  name: z.string().optional(),
  reasoning_content: z.string().optional(),
});
export type ChatMessage = z.infer<typeof ChatMessage>;
export type ChatMessageInput = z.input<typeof ChatMessage>;

/** True when any message holds an image, video or audio part. */
export function hasMultimodalContent(messages: readonly ChatMessage[]): boolean {
  return messages.some((m) => Array.isArray(m.content) && m.content.some((p) => p.type !== "text"));
}
