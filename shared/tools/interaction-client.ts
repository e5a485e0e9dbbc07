import { z } from "zod";
import { ToolError } from "../errors.ts";
import { ChatMessage, InteractionSpec } from "../schema/index.ts";
import { postWebhook, type WebhookOptions } from "./webhook-post.ts";

/** A simulated user's reply: `terminate` ends the trajectory; `content` becomes a `user` message; `score` goes to `turn_scores`. */
export const InteractionReply = z.object({
  terminate: z.boolean(),
  content: z.string(),
  score: z.number().nullish(),
});
export type InteractionReply = z.infer<typeof InteractionReply>;

export { InteractionSpec } from "../schema/tool.ts";

/**
 * The JSON body POSTed to a simulated user: `key` (trajectory key
 * `{uid}_{session_id}_{output_index}`), `turn` (the assistant turn just
 * finished, 1-based), `messages` (the whole conversation so far, the last
 * one the assistant's), `interaction_kwargs` (the row's
 * `extra_info.interaction_kwargs`, `{}` when empty). docs/tool-webhooks.md
 * documents it; docs/schemas/interaction-request.json is generated from it.
 */
export const InteractionRequestBody = z.object({
  key: z.string(),
  turn: z.number().int().min(1),
  messages: z.array(ChatMessage),
  interaction_kwargs: z.record(z.string(), z.unknown()),
});
export type InteractionRequestBody = z.infer<typeof InteractionRequestBody>;

/** One request to the simulated user. `turn` is the assistant turn (1-based) just finished. */
export interface InteractionRequest {
  key: string;
  turn: number;
  messages: readonly ChatMessage[];
  /** The row's `extra_info.interaction_kwargs` (e.g. the ground truth); sent as an extra field. */
  interaction_kwargs?: Record<string, unknown>;
  signal?: AbortSignal;
}

/**
 * The interactions webhook — verl's `interaction_kwargs` simulated user, over
 * HTTP: `POST url` with `{"key", "turn", "messages", "interaction_kwargs"}`
 * (the last field is an addition to the issue's body, so a simulated user can
 * see e.g. the ground truth), signed like tool calls, answering
 * `{"terminate": bool, "content": string, "score"?: number}`. Configured by
 * the tools file's `interactions` ({@link interactionClients}); the contract
 * is docs/tool-webhooks.md §5.
 * @see verl `BaseInteraction.generate_response` (§8 of the verl spec; removed upstream in April 2026)
 */
export class InteractionClient {
  constructor(
    readonly spec: InteractionSpec,
    private readonly opts: WebhookOptions & { secret?: string } = {},
  ) {}

  /**
   * Asks the simulated user for its next turn.
   * @throws ToolError when the webhook fails after its retries or replies with a bad body
   *   (the loop ends the trajectory with finish_reason "error").
   */
  async respond(req: InteractionRequest): Promise<InteractionReply> {
    const body: InteractionRequestBody = { key: req.key, turn: req.turn, messages: [...req.messages], interaction_kwargs: req.interaction_kwargs ?? {} };
    let reply;
    try {
      reply = await postWebhook(
        { url: this.spec.url, secret: this.opts.secret, timeout_ms: this.spec.timeout_ms, max_retries: this.spec.max_retries, ...(this.spec.max_reply_bytes ? { max_reply_bytes: this.spec.max_reply_bytes } : {}) },
        body,
        { ...this.opts, signal: req.signal ?? this.opts.signal },
      );
    } catch (e) {
      // Name the simulated user (the record's extra_fields.error), keeping the HTTP status.
      if (e instanceof ToolError) throw new ToolError(`interaction '${this.spec.name}': ${e.message}`, { status: e.status, retryable: e.retryable, cause: e });
      throw e;
    }
    if (reply.status !== 200) throw new ToolError(`interaction '${this.spec.name}': unexpected HTTP ${reply.status}`, { status: 502 });
    const r = InteractionReply.safeParse(reply.body);
    if (!r.success) {
      const i = r.error.issues[0];
      throw new ToolError(`interaction '${this.spec.name}': bad reply (${i?.path.join(".") || "body"}: ${i?.message})`, { status: 502 });
    }
    return r.data;
  }
}

/**
 * The simulated users of a tools file's `interactions`, by name, signed with
 * `secret` (the tools' `tools.secret`, so one secret covers tools, tool-result
 * callbacks and simulated users). Empty when the file configures none.
 */
export function interactionClients(specs: readonly InteractionSpec[], opts: WebhookOptions & { secret?: string } = {}): Record<string, InteractionClient> {
  const out: Record<string, InteractionClient> = {};
  for (const s of specs) out[s.name] = new InteractionClient(s, opts);
  return out;
}
