import { z } from "zod";
import { ToolError } from "../errors.ts";
import { redactUrl } from "../http/outbound.ts";
import { httpUrl, retriesCount, timerMs } from "../schema/config.ts";
import { postWebhook, type WebhookOptions } from "../tools/webhook-post.ts";

/** The reward webhook: where to POST (http(s)), per-attempt timeout (ms, at most 2147483647) and retries (at most 10). */
export const RewardWebhookSpec = z.object({
  url: httpUrl("must be an http: or https: URL"),
  timeout_ms: timerMs().positive().default(30_000),
  max_retries: retriesCount().default(2),
  /** Reply body cap in bytes (default 4 MiB). */
  max_reply_bytes: z.number().int().positive().optional(),
});
export type RewardWebhookSpec = z.infer<typeof RewardWebhookSpec>;

/** The body a reward webhook receives. `final_answer` is the decoded text of the last assistant turn. */
export interface RewardWebhookRequest {
  key: string;
  data_source: string;
  final_answer: string;
  ground_truth: unknown;
}

const RewardReply = z.object({ score: z.number() });

/**
 * The `webhook` reward: `POST url {key, data_source, final_answer, ground_truth}`
 * (signed like tool calls when a secret is set) → `200 {"score": number}`.
 * @throws ToolError when the webhook fails after its retries or the reply has no numeric `score`.
 */
export async function webhookReward(
  spec: RewardWebhookSpec,
  req: RewardWebhookRequest,
  opts: WebhookOptions & { secret?: string } = {},
): Promise<number> {
  const reply = await postWebhook(
    { url: spec.url, secret: opts.secret, timeout_ms: spec.timeout_ms, max_retries: spec.max_retries, ...(spec.max_reply_bytes ? { max_reply_bytes: spec.max_reply_bytes } : {}) },
    req,
    opts,
  );
  const r = RewardReply.safeParse(reply.body);
  if (reply.status !== 200 || !r.success) throw new ToolError(`reward webhook ${redactUrl(spec.url)}: expected 200 {"score": number}`, { status: 502 });
  return r.data.score;
}
