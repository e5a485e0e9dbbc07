import type { z } from "zod";
import { SglangGenerateReply } from "./sglang-client.ts";
import { ModelsReply, VllmCompletionReply, VllmGenerateReply } from "./vllm-wire.ts";

/** The wire schema of a 2xx reply, by request path (the engine endpoints edgeloop proxies). */
const SCHEMAS: Record<string, z.ZodType> = {
  "/v1/completions": VllmCompletionReply,
  "/inference/v1/generate": VllmGenerateReply,
  "/generate": SglangGenerateReply,
  "/v1/models": ModelsReply,
};

/**
 * What is wrong with a replica's 2xx reply to `path`, or null when it is
 * usable: a body that is not JSON, or JSON that does not match the engine's
 * wire schema for that endpoint (vLLM `/v1/completions`,
 * `/inference/v1/generate`, SGLang `/generate` — a single reply or a batch
 * array —, `/v1/models`). An event stream is not checked here (its chunks
 * are relayed as they come); other paths only need JSON when they say so in
 * `content-type`.
 * @see ../shared/fixtures/wire-contracts.md §1.3, §1.6, §2.2
 */
export function replyProblem(path: string, contentType: string | null, text: string): string | null {
  const ct = (contentType ?? "").toLowerCase();
  if (ct.includes("text/event-stream")) return null;
  const schema = SCHEMAS[path];
  if (!schema && !ct.includes("json")) return null;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return `body is not JSON (${JSON.stringify(text.slice(0, 60))})`;
  }
  if (!schema) return null;
  const items = path === "/generate" && Array.isArray(body) ? body : [body];
  for (const item of items) {
    const r = schema.safeParse(item);
    if (!r.success) {
      const i = r.error.issues[0];
      return `not a ${path} reply (${i?.path.join(".") || "body"}: ${i?.message})`;
    }
  }
  return null;
}
