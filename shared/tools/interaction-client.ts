import { z } from "zod";
import { ToolError } from "../errors.ts";
import type { ChatMessage } from "../schema/index.ts";
import { postWebhook, type WebhookOptions } from "./webhook-post.ts";

/** A simulated user's reply: `terminate` ends the trajectory; `content` becomes a `user` message; `score` goes to `turn_scores`. */
export const InteractionReply = z.object({
  terminate: z.boolean(),
  content: z.string(),
  score: z.number().nullish(),
});
export type InteractionReply = z.infer<typeof InteractionReply>;

/** Where a simulated user lives. */
export const InteractionSpec = z.object({
  name: z.string().min(1).default("interaction"),
  url: z.string().url(),
  timeout_ms: z.number().int().positive().default(30_000),
  max_retries: z.number().int().min(0).default(2),
});
export type InteractionSpec = z.infer<typeof InteractionSpec>;

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
 * `{"terminate": bool, "content": string, "score"?: number}`.
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
    const body = { key: req.key, turn: req.turn, messages: req.messages, interaction_kwargs: req.interaction_kwargs ?? {} };
    const reply = await postWebhook(
      { url: this.spec.url, secret: this.opts.secret, timeout_ms: this.spec.timeout_ms, max_retries: this.spec.max_retries },
      body,
      { ...this.opts, signal: req.signal ?? this.opts.signal },
    );
    if (reply.status !== 200) throw new ToolError(`interaction '${this.spec.name}': unexpected HTTP ${reply.status}`, { status: 502 });
    const r = InteractionReply.safeParse(reply.body);
    if (!r.success) {
      const i = r.error.issues[0];
      throw new ToolError(`interaction '${this.spec.name}': bad reply (${i?.path.join(".") || "body"}: ${i?.message})`, { status: 502 });
    }
    return r.data;
  }
}
