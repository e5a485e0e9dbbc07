import { z } from "zod";
import { ChatMessage } from "../schema/message.ts";
import { AgentRoleName } from "../schema/agent-role.ts";
import { ToolSchema } from "../schema/tool.ts";

/**
 * The task edgeloop POSTs to the agent webhook (`agent.url`) for each
 * `openai_agent` trajectory, signed with `x-edgeloop-signature` when
 * `agent.secret` is set (the scheme of tool calls).
 *
 * - `key`: the agent session's key (the trajectory key `{uid}_{session_id}_0`);
 *   a task may be delivered more than once (at-least-once after a crash):
 *   agents dedupe on `key`.
 * - `base_url`: the session's OpenAI-compatible endpoint
 *   (`…/v1/sessions/{key}/openai/v1`); `api_key`: its bearer token (give both
 *   to any OpenAI client).
 * - `messages`, `tools`: the row's prompt and the configured tools (OpenAI
 *   function format), to start the conversation with.
 * - `deadline`: epoch milliseconds; after it the session closes with the
 *   tokens so far and `error: agent_timeout`.
 * - `finish_url`: `POST {reward?, metadata?}` there (same bearer) ends the session.
 * - `row`: the row's `data_source`, `reward_model`, `extra_info` (for agents that score themselves).
 * - `agent_role` (present when the row has one): the session's role; calls
 *   without `X-Agent-Role` are that role's, and `model` is its pool's model.
 *
 * The webhook answers `202` (the agent runs and calls `finish_url` later) or
 * `200` with an optional {@link AgentTaskResult} body (the agent ran inside
 * the request and this is its finish).
 */
export const AgentTask = z.object({
  key: z.string().min(1),
  uid: z.string(),
  session_id: z.number().int().min(0),
  base_url: z.string().url(),
  api_key: z.string().min(1),
  finish_url: z.string().url(),
  model: z.string(),
  messages: z.array(ChatMessage).min(1),
  tools: z.array(ToolSchema),
  deadline: z.number().int(),
  agent_role: AgentRoleName.optional(),
  row: z.object({
    data_source: z.string().nullable(),
    reward_model: z.unknown().nullable(),
    extra_info: z.record(z.string(), z.unknown()).nullable(),
  }),
});
export type AgentTask = z.infer<typeof AgentTask>;

/**
 * Body of `POST /v1/sessions/{key}/finish` (and of a `200` answer to the
 * task): the agent's `reward` (null/absent: edgeloop scores the last
 * assistant message with the configured reward) and free `metadata` kept in
 * the records' `extra_fields.agent_metadata`.
 */
export const AgentTaskResult = z.object({
  reward: z.number().finite().nullish(),
  metadata: z.record(z.string(), z.unknown()).nullish(),
});
export type AgentTaskResult = z.infer<typeof AgentTaskResult>;
