import { z } from "zod";
import { finalTokenVersions, pushVersion, type TokenVersions } from "../inference/token-versions.ts";
import { StoreError } from "../errors.ts";
import { AgentLoopMetrics, AgentRoleName, ChatMessage, FinishReason, ModelId, MultiModal, RecordImage, RolloutConfig, RoutedExpertsShape, SamplingParams, ToolSchema, type AgentLoopOutput } from "../schema/index.ts";
import { decodeFloat32, decodeInt32 } from "../schema/typed-base64.ts";
import type { StoredSession } from "../session/session-storage.ts";
import { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import type { ChatReply } from "./openai-wire.ts";

/** Layout version of an agent session's stored input and events; another version is refused, never guessed at. */
export const AGENT_SESSION_VERSION = 1;

/**
 * What an agent session is created with, stored once as the session's input:
 * the trajectory's identity, its bearer token, its deadline (epoch ms), the
 * batch's sampling parameters and rollout config (budgets, parser, template
 * kwargs: a call may be served by any process), the configured tools and the
 * row's prompt (for the task), and the batch's policy version.
 */
export const AgentSessionInput = z.object({
  v: z.literal(AGENT_SESSION_VERSION),
  key: z.string().min(1),
  uid: z.string(),
  session_id: z.number().int().min(0),
  /**
   * The bearer token, given to {@link AgentGateway.create} and never stored:
   * the stored input holds `token_sha256` instead (S17). An input stored
   * before that (`token` in clear) is still read.
   */
  token: z.string().min(16).optional(),
  /** SHA-256 (hex) of the bearer token: what is stored and compared. */
  token_sha256: z.string().regex(/^[0-9a-f]{64}$/).optional(),
  created_ms: z.number(),
  deadline_ms: z.number(),
  sampling_params: SamplingParams,
  rollout: RolloutConfig,
  tools: z.array(ToolSchema),
  messages: z.array(ChatMessage),
  model_version: z.union([z.string(), z.number()]).nullable().default(null),
  /** The model of the gateway that created the session (`modelIdOf` its tokenizer): a gateway of another model refuses its calls. Absent in older sessions. */
  model: ModelId.optional(),
  /** The task's agent role (the row's `agent_role`): the role of every call that sends no `X-Agent-Role`. Absent: none. */
  agent_role: AgentRoleName.optional(),
}).refine((i) => i.token !== undefined || i.token_sha256 !== undefined, { message: "an agent session needs token (or token_sha256)", path: ["token"] });
export type AgentSessionInput = z.infer<typeof AgentSessionInput>;
export type AgentSessionInputArg = z.input<typeof AgentSessionInput>;

/**
 * Where a branch of the session's trajectory tree leaves its parent, stored
 * by reference instead of the shared tokens: `parent` (the parent's output
 * index, an earlier output), `at` (the token index into the parent's
 * prompt ‖ response where the branch starts: everything before it is the
 * parent's, token for token) and `messages` (how many of the parent's
 * messages the branch shares).
 */
export const BranchRef = z.object({
  parent: z.number().int().min(0),
  at: z.number().int().min(1),
  messages: z.number().int().min(1),
});
export type BranchRef = z.infer<typeof BranchRef>;

/**
 * The budgets of an output's builder, stored when the output opens. With
 * `branch` (a branch of the trajectory tree, see {@link BranchRef})
 * `prompt_ids` holds only the prompt ids after `branch.at` (empty when the
 * branch starts in the parent's response: its prompt is the parent's) and
 * `messages` only the messages after the shared `branch.messages`.
 */
const OpenOutput = z.object({
  branch: BranchRef.optional(),
  prompt_ids: z.string(),
  prompt_truncated: z.boolean(),
  response_length: z.number().int().min(1),
  max_model_len: z.number().int().min(1),
  prompt_length: z.number().int().min(1),
  track_logprobs: z.boolean(),
  messages: z.array(ChatMessage),
  tools: z.array(ToolSchema).nullable(),
  /** The agent role of the calls this output holds (a call of another role opens another output); absent: none. */
  agent_role: AgentRoleName.optional(),
  /** The model name of the engine pool that serves the output's role (the records' `served_model`); present with `agent_role`. */
  served_model: z.string().optional(),
  /**
   * A prompt with images (a vision-language family): the record's `multi_modal` for the
   * prompt's images (spans in the prompt, placeholders expanded in `prompt_ids`) and the
   * images as data URIs in placeholder order, the engine calls' `image_data`. Absent: none.
   */
  multi_modal: MultiModal.optional(),
  image_data: z.array(z.string()).optional(),
});

/** The processor settings and placeholder ids of a `multi_modal` field, without its images: stored once per output, with its first images. */
const VisionMeta = MultiModal.omit({ images: true, dropped_images: true });

/**
 * One answered chat call: either it opened a new output (`open`: the fresh
 * render of the request's messages, or a branch of an earlier output by
 * reference, `open.branch`) or continued an output at its end (`added`:
 * the new messages, `obs`: their observation ids, mask 0; a branch opened in
 * its parent's response may carry them too, appended after the shared
 * prefix); then the sampled
 * ids (`action`, mask 1, float32 log-probs) and the reply exactly as given,
 * kept so that a retried request (or a known idempotency key) is answered again
 * without an engine call.
 * Every builder operation is stored with the ids passed to it, so folding the
 * events replays the builder bit for bit (cuts included). `versions`: the
 * policy versions of the action's kept ids as run-length segments relative to
 * the action (`[[0, "v1"], [17, "v2"]]`: a call aborted by a pause and resumed
 * under new weights); absent in events written before the field existed, which
 * fold as `[[0, model_version]]`. `experts` (routed experts requested): the
 * routed experts of prompt ‖ response from position `from` on after the
 * action (base64 int32 `[tokens, layers, top_k]`), replacing what the
 * builder held there.
 */
export const TurnEvent = z.object({
  e: z.literal("turn"),
  hash: z.string(),
  open: OpenOutput.optional(),
  added: z.array(ChatMessage).optional(),
  obs: z.string().optional(),
  action: z.object({ ids: z.string(), lps: z.string().nullable() }).optional(),
  mark_truncated: z.boolean(),
  ended: z.boolean(),
  finish_reason: FinishReason,
  terminated_by: z.string(),
  assistant: ChatMessage.nullable(),
  reply: z.record(z.string(), z.unknown()),
  metrics: AgentLoopMetrics,
  model_version: z.unknown().optional(),
  versions: z.array(z.tuple([z.number().int().min(0), z.unknown()])).optional(),
  experts: z.object({ from: z.number().int().min(0), data: z.string(), shape: RoutedExpertsShape }).optional(),
  /** The output a continuing turn continues (at its end), when not the last one: a tree's earlier leaf. */
  output: z.number().int().min(0).optional(),
  /** The call's `Idempotency-Key` header, when it had one (absent in events written before keys were kept). */
  idem: z.string().optional(),
  tool_calls: z.number().int().min(0),
  user_turns: z.number().int().min(0),
  /**
   * The observation's images that were appended (`obs` holds their expanded placeholders,
   * spans in prompt ‖ response), with their data URIs (`image_data`, same order) and, for an
   * output that had no image yet, the `multi_modal` settings (`vision`).
   */
  images: z.array(RecordImage).optional(),
  image_data: z.array(z.string()).optional(),
  vision: VisionMeta.optional(),
});
export type TurnEvent = z.infer<typeof TurnEvent>;

/** The task was accepted by the agent webhook (it is not sent again on resume). */
export const TaskEvent = z.object({ e: z.literal("task") });
/** A new bearer token (its SHA-256, hex) replaces the session's: a resumed loop that must send the task again. */
export const TokenEvent = z.object({ e: z.literal("token"), sha256: z.string().regex(/^[0-9a-f]{64}$/) });
export type TokenEvent = z.infer<typeof TokenEvent>;
/**
 * The session's end: by the agent's finish call, by the task's answer, by the
 * deadline, or `failed` (the trajectory failed — a webhook that refused the
 * task — and later calls must not look answered).
 */
export const FinishEvent = z.object({
  e: z.literal("finish"),
  by: z.enum(["agent", "task", "timeout", "failed"]),
  reward: z.number().nullable(),
  metadata: z.record(z.string(), z.unknown()).nullable(),
});
export type FinishEvent = z.infer<typeof FinishEvent>;
/** The first event: the session exists. */
export const OpenEvent = z.object({ e: z.literal("open") });
/**
 * The client of output `output`'s assistant turn `turn` (1-based, the reply
 * id's turn) went away before it received the reply (issue 30 item 6): the
 * request's signal aborted before the reply was written, or the stream was
 * cancelled before its last event. The turn stays in the record, marked
 * `abandoned` ({@link agentOutputs}), until a later turn continues that
 * output (the agent sent the reply back in its history), which clears it.
 */
export const AbandonEvent = z.object({ e: z.literal("abandon"), output: z.number().int().min(0), turn: z.number().int().min(1) });
export type AbandonEvent = z.infer<typeof AbandonEvent>;

/** One stored event of an agent session (a delta of the append-only session log). */
export const AgentSessionEvent = z.discriminatedUnion("e", [OpenEvent, TaskEvent, TokenEvent, TurnEvent, FinishEvent, AbandonEvent]);
export type AgentSessionEvent = z.infer<typeof AgentSessionEvent>;

/** What an output had counted at a point of its token stream (a branch starting there starts from these). */
export interface TurnCounts {
  assistantTurns: number;
  userTurns: number;
  toolCalls: number;
  metrics: AgentLoopMetrics;
  lastActionIds: Int32Array | null;
}

/**
 * One sampled turn of an output, where a branch may start: at `start` (the
 * token index of prompt ‖ response the turn was sampled from: a re-ask of the
 * same messages branches there) or at `end` (just after its sampled ids: a
 * request that rewrites what followed branches there). `msg`: the index of
 * the turn's assistant message in the output's messages. `after` is null when
 * the turn ended its output (a budget, `max_assistant_turns`): no branch
 * continues past it.
 */
export interface TurnMark {
  msg: number;
  start: number;
  end: number;
  before: TurnCounts;
  after: TurnCounts | null;
}

/** One output of an agent session: a token trajectory and the conversation it holds. */
export interface AgentOutputState {
  /** Position among the session's outputs (its `output_index`). */
  index: number;
  /** The output this one branched from (its index), or null for a root of the session's trajectory tree. */
  parent: number | null;
  /** Token index into the parent's prompt ‖ response where this output branched off (the tokens before it are the parent's); null for a root. */
  branchAt: number | null;
  /** How many of `messages` the prompt ids render (a branch in the prompt region is checked against them). */
  promptMessages: number;
  /** The output's sampled turns, oldest first, the parent's shared ones included (see {@link TurnMark}). */
  turns: TurnMark[];
  /** The conversation so far: the request messages and every reply as the agent received it. */
  messages: ChatMessage[];
  /** The tools the prompt was rendered with (a request with other tools opens a new output). */
  tools: ToolSchema[] | undefined;
  toolsKey: string;
  builder: TrajectoryBuilder;
  assistantTurns: number;
  userTurns: number;
  /** Tool calls the model made in this output (parsed from its replies). */
  toolCalls: number;
  metrics: AgentLoopMetrics;
  modelVersions: unknown[];
  /** Policy versions of the response tokens, run-length over `response_ids` (the record's `extra_fields.token_versions`). */
  tokenVersions: TokenVersions;
  finishReason: FinishReason;
  terminatedBy: string;
  /** A budget (or `max_assistant_turns`) ended it: the next call opens a new output. */
  ended: boolean;
  /** The last answered request's hash and reply. */
  last: { hash: string; reply: ChatReply } | null;
  /** The sampled ids of the last assistant turn (the reward reads their text, as `tool_agent`'s does). */
  lastActionIds: Int32Array | null;
  /** The agent role of its calls and the serving pool's model name ({@link OpenOutput}); null without a role. */
  role: { name: string; servedModel: string } | null;
  /** Where the last assistant turn's ids sit in the response: `[start, end)`, and its turn number (1-based). */
  lastAction?: { turn: number; start: number; end: number };
  /** The last turn, abandoned by its client ({@link AbandonEvent}); cleared by a turn that continues this output. */
  abandoned?: { turn: number; start: number; end: number } | null;
  /**
   * The images the output's tokens hold (a vision-language family): the record's
   * `multi_modal` and their data URIs in placeholder order (every engine call's
   * `image_data`); null for a text-only output.
   */
  vision: OutputVision | null;
}

/** An output's images: the record's `multi_modal` and the engine's `image_data` (parallel to `multiModal.images`). */
export interface OutputVision {
  multiModal: MultiModal;
  imageData: string[];
}

/**
 * Adds an observation's images to `out` (creating its vision state from `meta` when it had none):
 * the live call and the fold both go through here.
 */
export function addImages(out: AgentOutputState, images: readonly RecordImage[], imageData: readonly string[], meta: z.infer<typeof VisionMeta> | undefined): void {
  if (images.length === 0) return;
  if (images.length !== imageData.length) throw new StoreError(`agent output ${out.index}: ${images.length} images but ${imageData.length} image_data entries`, { retryable: false });
  if (!out.vision) {
    if (!meta) throw new StoreError(`agent output ${out.index}: images without their multi_modal settings`, { retryable: false });
    out.vision = { multiModal: { ...meta, images: [] }, imageData: [] };
  }
  out.vision.multiModal.images.push(...images);
  out.vision.imageData.push(...imageData);
}

/** An agent session as the fold of its events. */
export interface AgentSessionState {
  input: AgentSessionInput;
  /**
   * The replies of the last {@link RECENT_REPLIES} answered calls by request hash,
   * newest last: a retry of any of them (`x-stainless-retry-count` ≥ 1; an
   * agent with calls in parallel) is answered again, not sampled twice. An
   * equal request that is no retry is sampled again.
   */
  recent: Map<string, ChatReply>;
  /**
   * The request hash and reply of the last {@link IDEMPOTENCY_KEYS} calls that
   * carried an `Idempotency-Key`, by key, newest last (folded from the turn
   * events' `idem`): the same key with the same body is answered again, with
   * another body refused.
   */
  keyed: Map<string, { hash: string; reply: ChatReply }>;
  /** The step of the last applied event (−1 before the first). */
  step: number;
  outputs: AgentOutputState[];
  /** SHA-256 (hex) of the session's bearer token (the input's, or the last `token` event's); null for an input stored with `token` in clear. */
  tokenSha256: string | null;
  /**
   * The bearer token in clear, held in memory only by the process that set it
   * (create, {@link AgentGateway.rekey}); undefined in a state read back from storage.
   */
  token?: string;
  /** Answered calls that sampled (engine calls), for `limits.max_engine_calls_per_session`. */
  engineCalls: number;
  taskSent: boolean;
  finish: FinishEvent | null;
}

/** What opens an output (see {@link TurnEvent}`.open`). */
export type OpenOutput = z.infer<typeof OpenOutput>;

/**
 * Opens the next output of `st` (pushed last): a fresh render, or with
 * `o.branch` a branch of an earlier output — sharing its prompt ‖ response up
 * to `branch.at` (a fork of its builder, its counts and token versions there,
 * when `at` lies in the parent's response; the parent's prompt ids before
 * `at` ‖ `o.prompt_ids` when it lies in the parent's prompt).
 * @throws StoreError (not retryable) for a branch whose parent or point does not exist.
 */
export function openOutput(st: AgentSessionState, o: OpenOutput): AgentOutputState {
  if (o.branch) return openBranch(st, o, o.branch);
  const out: AgentOutputState = {
    index: st.outputs.length,
    parent: null,
    branchAt: null,
    promptMessages: o.messages.length,
    turns: [],
    messages: o.messages.slice(),
    tools: o.tools ?? undefined,
    toolsKey: toolsKeyOf(o.tools ?? undefined),
    builder: new TrajectoryBuilder({
      promptIds: decodeInt32(o.prompt_ids),
      responseLength: o.response_length,
      maxModelLen: o.max_model_len,
      trackLogProbs: o.track_logprobs,
      promptLength: o.prompt_length,
      promptTruncated: o.prompt_truncated,
    }),
    assistantTurns: 0,
    userTurns: 0,
    toolCalls: 0,
    metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
    modelVersions: [],
    tokenVersions: [],
    finishReason: "stop",
    terminatedBy: "agent",
    ended: false,
    last: null,
    lastActionIds: null,
    role: o.agent_role !== undefined ? { name: o.agent_role, servedModel: o.served_model ?? o.agent_role } : null,
    vision: o.multi_modal ? { multiModal: { ...o.multi_modal, images: o.multi_modal.images.slice() }, imageData: (o.image_data ?? []).slice() } : null,
  };
  if (out.vision && out.vision.imageData.length !== out.vision.multiModal.images.length) {
    throw new StoreError(`agent session '${st.input.key}': output ${out.index} opens with ${out.vision.multiModal.images.length} images but ${out.vision.imageData.length} image_data entries`, { retryable: false });
  }
  st.outputs.push(out);
  return out;
}

/** The parent's images whose placeholders end at or before token `at` (a branch shares prompt ‖ response up to there). */
function visionBefore(parent: AgentOutputState, at: number): OutputVision | null {
  if (!parent.vision) return null;
  const keep = parent.vision.multiModal.images.map((img, i) => [img, i] as const).filter(([img]) => img.span[1] < at);
  if (keep.length === 0) return null;
  return { multiModal: { ...parent.vision.multiModal, images: keep.map(([img]) => img) }, imageData: keep.map(([, i]) => parent.vision!.imageData[i]!) };
}

function openBranch(st: AgentSessionState, o: OpenOutput, br: BranchRef): AgentOutputState {
  const bad = (why: string) => new StoreError(`agent session '${st.input.key}': output ${st.outputs.length} branches from output ${br.parent} at token ${br.at}: ${why}`, { retryable: false });
  const parent = st.outputs[br.parent];
  if (!parent) throw bad("no such output");
  if (br.messages > parent.messages.length) throw bad(`the parent holds ${parent.messages.length} messages, not ${br.messages}`);
  const P = parent.builder.promptIds.length;
  const messages = parent.messages.slice(0, br.messages).concat(o.messages);
  if (o.multi_modal) throw bad("a branch inherits its parent's images and stores none of its own prompt's");
  const common = { index: st.outputs.length, parent: parent.index, branchAt: br.at, messages, tools: parent.tools, toolsKey: parent.toolsKey, finishReason: "stop" as const, terminatedBy: "agent", ended: false, last: null, role: o.agent_role !== undefined ? { name: o.agent_role, servedModel: o.served_model ?? o.agent_role } : parent.role, vision: visionBefore(parent, br.at) };
  let out: AgentOutputState;
  if (br.at >= P) {
    if (o.prompt_ids !== "") throw bad("a branch in the parent's response stores no prompt ids");
    const mark = parent.turns.find((m) => m.start === br.at || (m.end === br.at && m.after));
    const counts = mark ? (mark.start === br.at ? mark.before : mark.after!) : br.at === P ? zeroCounts() : null;
    if (!counts) throw bad("not the start or end of one of its sampled turns");
    const n = br.at - P;
    out = {
      ...common,
      promptMessages: parent.promptMessages,
      turns: parent.turns.filter((m) => m.end <= br.at),
      builder: parent.builder.forkAt(br.at),
      assistantTurns: counts.assistantTurns,
      userTurns: counts.userTurns,
      toolCalls: counts.toolCalls,
      metrics: { ...counts.metrics },
      modelVersions: parent.modelVersions.slice(0, counts.assistantTurns),
      tokenVersions: parent.tokenVersions.filter(([s]) => s < n).map(([s, v]) => [s, v] as [number, unknown]),
      lastActionIds: counts.lastActionIds,
    };
  } else {
    const own = decodeInt32(o.prompt_ids);
    const promptIds = new Int32Array(br.at + own.length);
    promptIds.set(parent.builder.promptIds.subarray(0, br.at));
    promptIds.set(own, br.at);
    out = {
      ...common,
      promptMessages: messages.length,
      turns: [],
      builder: new TrajectoryBuilder({ promptIds, responseLength: o.response_length, maxModelLen: o.max_model_len, trackLogProbs: o.track_logprobs, promptLength: o.prompt_length, promptTruncated: o.prompt_truncated }),
      ...zeroCounts(),
      modelVersions: [],
      tokenVersions: [],
    };
  }
  st.outputs.push(out);
  return out;
}

function zeroCounts(): TurnCounts & { metrics: AgentLoopMetrics } {
  return { assistantTurns: 0, userTurns: 0, toolCalls: 0, metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, lastActionIds: null };
}

/** The counts of `out` now (a snapshot: the metrics copied). */
function countsOf(out: AgentOutputState): TurnCounts {
  return { assistantTurns: out.assistantTurns, userTurns: out.userTurns, toolCalls: out.toolCalls, metrics: { ...out.metrics }, lastActionIds: out.lastActionIds };
}

/** Where a turn about to be sampled starts: taken before the engine call (live) or the action (fold). */
export interface PendingMark {
  start: number;
  before: TurnCounts;
}

/** Notes that `out` is about to sample a turn from its current end (see {@link endTurnMark}). */
export function beginTurnMark(out: AgentOutputState): PendingMark {
  return { start: out.builder.contextLength, before: countsOf(out) };
}

/**
 * Records the sampled turn begun by {@link beginTurnMark}, once its action,
 * assistant message and counts are applied: the live call and the fold both
 * go through here, so a folded session offers the same branch points.
 */
export function endTurnMark(out: AgentOutputState, p: PendingMark): void {
  out.turns.push({ msg: out.messages.length - 1, start: p.start, end: out.builder.contextLength, before: p.before, after: out.ended ? null : countsOf(out) });
}

/** Answered calls a session remembers for replay (see {@link AgentSessionState.recent}). */
export const RECENT_REPLIES = 16;

/** Records an answered call's reply for replay, dropping the oldest past {@link RECENT_REPLIES}. */
export function rememberReply(st: AgentSessionState, hash: string, reply: ChatReply): void {
  st.recent.delete(hash);
  st.recent.set(hash, reply);
  if (st.recent.size > RECENT_REPLIES) st.recent.delete(st.recent.keys().next().value!);
}

/** Idempotency keys a session remembers (see {@link AgentSessionState.keyed}); an older key is forgotten and counts as new. */
export const IDEMPOTENCY_KEYS = 256;

/** Records a keyed call's request hash and reply, dropping the oldest key past {@link IDEMPOTENCY_KEYS}. */
export function rememberKey(st: AgentSessionState, idem: string, hash: string, reply: ChatReply): void {
  st.keyed.delete(idem);
  st.keyed.set(idem, { hash, reply });
  if (st.keyed.size > IDEMPOTENCY_KEYS) st.keyed.delete(st.keyed.keys().next().value!);
}

/** A stable key for a tool list (order matters: it is the template's order). */
export function toolsKeyOf(tools: readonly ToolSchema[] | undefined): string {
  return tools && tools.length ? JSON.stringify(tools) : "";
}

/** A fresh state for `input` (no events applied). */
export function newAgentState(input: AgentSessionInput): AgentSessionState {
  return { input, step: -1, outputs: [], tokenSha256: input.token_sha256 ?? null, engineCalls: 0, taskSent: false, finish: null, recent: new Map(), keyed: new Map() };
}

/**
 * Applies one event to `st` (in place): the single definition of what an
 * event means, used both when a call is answered live and when a stored
 * session is folded, so the two can never disagree.
 */
export function applyEvent(st: AgentSessionState, ev: AgentSessionEvent): void {
  switch (ev.e) {
    case "open":
      return;
    case "task":
      st.taskSent = true;
      return;
    case "token":
      st.tokenSha256 = ev.sha256;
      if (st.token !== undefined) delete st.token;
      return;
    case "finish":
      st.finish = ev;
      return;
    case "abandon": {
      const out = st.outputs[ev.output];
      if (out?.lastAction && out.lastAction.turn === ev.turn) out.abandoned = { ...out.lastAction };
      return;
    }
    case "turn": {
      let out: AgentOutputState;
      if (ev.open) {
        out = openOutput(st, ev.open);
      } else {
        const at = ev.output ?? st.outputs.length - 1;
        const cur = st.outputs[at];
        if (!cur) throw new StoreError(`agent session '${st.input.key}': a continuing turn without an output (${at})`, { retryable: false });
        out = cur;
        // The agent continued from its last reply: it did receive it.
        out.abandoned = null;
      }
      if (ev.added) out.messages.push(...ev.added);
      if (ev.obs !== undefined) {
        out.builder.appendObservation(decodeInt32(ev.obs));
        out.userTurns++;
        if (ev.images) addImages(out, ev.images, ev.image_data ?? [], ev.vision);
      }
      const mark = beginTurnMark(out);
      if (ev.action) {
        st.engineCalls++;
        const ids = decodeInt32(ev.action.ids);
        recordActionVersions(out.tokenVersions, out.builder.responseLength, ids.length, ev.versions ?? [[0, ev.model_version ?? null]]);
        const start = out.builder.responseLength;
        out.builder.appendAction(ids, ev.action.lps === null ? null : decodeFloat32(ev.action.lps));
        out.lastAction = { turn: out.assistantTurns + 1, start, end: out.builder.responseLength };
        if (ev.experts) {
          const data = decodeInt32(ev.experts.data);
          const [layers, topK] = ev.experts.shape;
          out.builder.applyRoutedExperts({ data, shape: [layers, topK], start: ev.experts.from, tokens: data.length / (layers * topK) });
        }
        out.assistantTurns++;
        out.modelVersions.push(ev.model_version ?? null);
        out.lastActionIds = ids;
      }
      if (ev.mark_truncated) out.builder.markTruncated();
      if (ev.assistant) out.messages.push(ev.assistant);
      out.userTurns = ev.user_turns;
      out.toolCalls += ev.tool_calls;
      out.metrics = { ...ev.metrics };
      out.finishReason = ev.finish_reason;
      out.terminatedBy = ev.terminated_by;
      out.ended = ev.ended;
      if (ev.action) endTurnMark(out, mark);
      out.last = { hash: ev.hash, reply: ev.reply as unknown as ChatReply };
      rememberReply(st, ev.hash, out.last.reply);
      if (ev.idem !== undefined) rememberKey(st, ev.idem, ev.hash, out.last.reply);
      return;
    }
  }
}

/**
 * Records an action of `length` kept ids appended at response index `offset`
 * with its turn-relative version segments (segments starting at or past
 * `length` were cut with the ids and are dropped); the live call and the fold
 * both go through here. Empty actions add nothing.
 */
export function recordActionVersions(segs: TokenVersions, offset: number, length: number, versions: readonly (readonly [number, unknown])[]): void {
  if (length === 0) return;
  for (const [start, v] of versions) if (start < length) pushVersion(segs, offset + start, v);
}

/**
 * Folds a stored agent session (its input and events, oldest first).
 * @throws StoreError (not retryable) when the input or an event is malformed or of another layout version.
 */
export function foldAgentSession(key: string, stored: StoredSession): AgentSessionState {
  if (!stored.input) throw new StoreError(`agent session '${key}': stored without its input`, { retryable: false });
  let input: AgentSessionInput;
  try {
    input = AgentSessionInput.parse(JSON.parse(stored.input));
  } catch (e) {
    throw new StoreError(`agent session '${key}': stored input is not an agent session of layout v${AGENT_SESSION_VERSION}: ${(e as Error).message.slice(0, 300)}`, { retryable: false });
  }
  const st = newAgentState(input);
  for (const [i, d] of stored.deltas.entries()) {
    let ev: AgentSessionEvent;
    try {
      ev = AgentSessionEvent.parse(JSON.parse(d));
    } catch (e) {
      throw new StoreError(`agent session '${key}': stored event ${i} is malformed: ${(e as Error).message.slice(0, 300)}`, { retryable: false });
    }
    applyEvent(st, ev);
  }
  st.step = stored.step;
  return st;
}

/**
 * The session's outputs as loop outputs (validated by the builder), every one
 * scored with `reward` (the agent's, or the configured reward of the last
 * assistant message: a session's outputs share its outcome), with
 * `extra_fields.token_versions` (run-length `[[start, version], …]` over
 * `response_ids`, as `tool_agent` records them; absent when no version is known),
 * and `agent_role` / `served_model` for an output of a role. `error` (e.g.
 * `agent_timeout`) and the agent's `metadata` go into `extra_fields`.
 * Every output is one trajectory on its own — a branch of the session's
 * tree holds its parent's prompt ‖ response up to `branch_at` (sampled ids
 * mask 1, as a linear session along that path would record them) — and
 * names its place in the tree: `parent_output_index` and `branch_at` (both
 * null for a root).
 *
 * An output whose last turn was abandoned ({@link AbandonEvent}: its client
 * never received it, and the agent did not continue from it) is kept for
 * inspection with `extra_fields.abandoned: {turn, start, end}` (the turn,
 * 1-based, and its tokens' `[start, end)` in `response_ids`), those tokens
 * masked 0 with log-probs 0.0 (unless `abandonedMask: "keep"`: mask and
 * log-probs as sampled), and `reward_score` null: it is never credited with
 * the session's reward.
 * @throws TrajectoryInvariantError when an output breaks an invariant (never expected).
 */
export function agentOutputs(st: AgentSessionState, o: { reward: number | null; error?: string; metadata?: Record<string, unknown> | null; rewardError?: string; abandonedMask?: "zero" | "keep" }): AgentLoopOutput[] {
  return st.outputs.map((out) => {
    const extra: Record<string, unknown> = {
      output_count: st.outputs.length,
      tool_calls: out.toolCalls,
      terminated_by: st.finish?.by === "timeout" && out.index === st.outputs.length - 1 && !out.ended ? "agent_timeout" : out.terminatedBy,
    };
    if (out.modelVersions.some((v) => v !== null)) extra.model_versions = out.modelVersions;
    const tv = finalTokenVersions(out.tokenVersions, out.builder.responseLength);
    if (tv) extra.token_versions = tv;
    if (o.metadata) extra.agent_metadata = o.metadata;
    if (o.error) extra.error = o.error;
    if (o.rewardError) extra.reward_error = o.rewardError;
    const gone = out.abandoned ?? null;
    if (gone) extra.abandoned = { turn: gone.turn, start: gone.start, end: gone.end };
    const rec = out.builder.finish({
      numTurns: out.assistantTurns + out.userTurns + 1,
      rewardScore: gone ? null : o.reward,
      metrics: out.metrics,
      extraFields: extra,
      finishReason: out.finishReason,
    });
    if (gone && o.abandonedMask !== "keep") {
      // Mask 0 trains nothing: the log-probs there are 0.0, as under every mask-0 token (the validator's invariant 2).
      const off = (i: number) => i >= gone.start && i < gone.end;
      rec.response_mask = rec.response_mask.map((m, i) => (off(i) ? 0 : m));
      if (rec.response_logprobs) rec.response_logprobs = rec.response_logprobs.map((v, i) => (off(i) ? 0 : v));
      if (rec.teacher_log_probs) rec.teacher_log_probs = rec.teacher_log_probs.map((v, i) => (off(i) ? 0 : v));
    }
    return { ...rec, parent_output_index: out.parent, branch_at: out.branchAt, ...(out.role ? { agent_role: out.role.name, served_model: out.role.servedModel } : {}), ...(out.vision ? { multi_modal: out.vision.multiModal } : {}) };
  });
}

/** The sampled ids of the session's last assistant turn (the reward's input, decoded), or null when it sampled nothing. */
export function lastActionIds(st: AgentSessionState): Int32Array | null {
  for (let i = st.outputs.length - 1; i >= 0; i--) if (st.outputs[i]!.lastActionIds) return st.outputs[i]!.lastActionIds;
  return null;
}

/** SHA-256 (lower-case hex) of a bearer token, via Web Crypto: what a session stores and compares. */
export async function tokenSha256(token: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
