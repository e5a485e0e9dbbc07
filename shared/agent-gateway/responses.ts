import { InputError, NotFoundError } from "../errors.ts";
import type { ChatMessage } from "../schema/message.ts";
import type { AgentGateway, TurnOptions } from "./agent-gateway.ts";
import type { AgentSessionState } from "./agent-session.ts";
import type { ChatReply, ChatRequest } from "./openai-wire.ts";
import { parseResponseId, parseResponsesRequest, responseIdOf, responsesChatRequest, type ResponsesEcho } from "./responses-wire.ts";

/** One answered Responses call: the turn's reply, its response id, what the reply echoes, and whether it streams. */
export interface ResponsesAnswer {
  reply: ChatReply;
  id: string;
  echo: ResponsesEcho;
  stream: boolean;
}

/**
 * The conversation (input and output messages) of response `id` in session
 * `st`, read from the session's own record (see `ResponseRef`): durable and
 * shared by every process serving the session, nothing kept beside the record.
 * Null when `id` is not a response of this session.
 */
export function responseConversation(st: AgentSessionState, id: string): { messages: ChatMessage[]; instructions: boolean } | null {
  const ref = parseResponseId(st.input.key, id);
  if (!ref || ref.step > st.step) return null;
  const out = st.outputs[ref.output];
  if (!out || ref.messages < 1 || out.messages.length < ref.messages) return null;
  const messages = out.messages.slice(0, ref.messages);
  const reply = out.messages[ref.messages];
  if (reply?.role === "assistant") messages.push(reply);
  return { messages, instructions: ref.instructions };
}

/**
 * Answers one Responses call (`POST …/openai/v1/responses`) of an authorized
 * session: the body parsed ({@link parseResponsesRequest}),
 * `previous_response_id` resolved against the session's record
 * ({@link responseConversation}), and one turn through
 * {@link AgentGateway.turnAuthorized} — the same continuation, replay and
 * limit rules as chat completions, so a conversation recorded through either
 * API has the same tokens.
 * @throws InputError (400) naming the field (`previous_response_id` for an id
 *   this session did not answer); everything `turnAuthorized` throws.
 */
export async function answerResponses(gw: AgentGateway, key: string, body: unknown, opts: TurnOptions = {}): Promise<ResponsesAnswer> {
  const { req, echo, instructions } = await prepareResponses(gw, key, body);
  const reply = await gw.turnAuthorized(key, req, opts);
  return { reply, id: responseIdOf(reply, req.messages.length, instructions), echo, stream: req.stream };
}

/** A Responses call ready for its turn: the {@link ChatRequest} it becomes, what its reply echoes, and whether its first message is its `instructions` (the response id says so). */
export interface PreparedResponses {
  req: ChatRequest;
  echo: ResponsesEcho;
  instructions: boolean;
}

/**
 * The parsing half of {@link answerResponses} (a streamed call builds its
 * writer from it before the turn runs).
 * @throws as {@link answerResponses}, less the turn's errors.
 */
export async function prepareResponses(gw: AgentGateway, key: string, body: unknown): Promise<PreparedResponses> {
  const p = parseResponsesRequest(body);
  let previous: ReturnType<typeof responseConversation> = null;
  if (p.previous_response_id !== null) {
    const st = await gw.get(key);
    if (!st) throw new NotFoundError(`no agent session '${key.slice(0, 200)}'`, { field: "key" });
    previous = responseConversation(st, p.previous_response_id);
    if (!previous) throw new InputError("previous_response_id", `'${p.previous_response_id.slice(0, 100)}' is not a response of this session`);
  }
  return { req: responsesChatRequest(p, previous), echo: p.echo, instructions: p.instructions !== null };
}
