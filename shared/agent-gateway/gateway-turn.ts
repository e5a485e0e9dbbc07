import { LRUCache } from "lru-cache";
import { DEFAULT_SESSION_LIMITS, SessionLimitError, type SessionLimits } from "../agent-loop/session-limits.ts";
import { AgentLoop, type AgentLoopContext } from "../agent-loop/agent-loop.ts";
import { contextSize } from "../inference/context-size.ts";
import { addPreempted, modelVersionOf, turnVersions, type TokenVersions } from "../inference/token-versions.ts";
import { EdgeloopError, InputError, TemplateError } from "../errors.ts";
import { fnv1a32 } from "../inference/hash.ts";
import type { InferenceClient } from "../inference/types.ts";
import type { AgentLoopOutput, ChatMessage, RoutedExpertsSpan, SamplingParams, ToolSchema } from "../schema/index.ts";
import { encodeFloat32, encodeInt32 } from "../schema/typed-base64.ts";
import { createToolCallParser } from "../tools/parser-registry.ts";
import { ObservationEncoder } from "../tokens/observation.ts";
import { buildPromptIds } from "../tokens/prompt.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import type { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import { addImages, beginTurnMark, endTurnMark, openOutput, recordActionVersions, rememberKey, rememberReply, toolsKeyOf, type AgentOutputState, type AgentSessionState, type OpenOutput, type TurnEvent } from "./agent-session.ts";
import { hasMultimodalContent } from "../schema/index.ts";
import { imageDataUri, visionPrompt } from "../agent-loop/vision-prompt.ts";
import { appendImageObservation, encodeImageObservation, imageObservationEncoder, multiModalField, resolveImages } from "../vision/multimodal-tokens.ts";
import { namedToolResults, parseReply, sessionTag } from "./conversation.ts";
import { planTurn } from "./trajectory-tree.ts";
import { IMAGE_PART_PATHS } from "./wire-fields.ts";
import type { ChatReply, ChatRequest } from "./openai-wire.ts";
import { promptOpensThink, STREAM_MARKERS, TurnStream, type TurnSink } from "./turn-stream.ts";

/** What {@link GatewayTurns} reads of its gateway's options (`AgentGatewayOptions`: the same fields). */
export interface GatewayTurnOptions {
  tokenizer: ChatTokenizer;
  client: InferenceClient;
  maxModelLen?: number;
  newRequestId?: () => string;
  limits?: SessionLimits;
}

/** How one call is answered, besides its request: see `TurnOptions` of the gateway. */
export interface AnswerOptions {
  /** The call's `Idempotency-Key`: recorded with the turn (`TurnEvent.idem`). */
  idempotencyKey?: string;
  /**
   * The request equals an answered call without being its retry (a deliberate
   * re-ask): sent with a seed of its own ({@link resampleSeed}) when the
   * session's sampling has a fixed seed and the request names none.
   */
  resample?: boolean;
  /**
   * The call's agent role and its pool's model name (the gateway resolved
   * them): only an output of the same role (or, without one, of none) is
   * continued, and an output opened records them.
   */
  role?: { name: string; servedModel: string };
  /**
   * Streams the turn while it is sampled (true streaming): the engine's
   * tokens, through a {@link TurnStream}, as the reply will hold them. The
   * sink's `start` comes with the first token (a turn that samples nothing
   * never starts it); the rest of the reply is the returned event's.
   */
  sink?: TurnSink;
}

/**
 * How the agent gateway answers one chat call of a session (see
 * `AgentGateway`'s class doc, steps 2 and 3, and the engine call after them):
 * continue the current output with the request's new messages encoded
 * incrementally, or open the next output with a fresh render; one engine
 * call through the loop machinery ({@link TurnRunner}); the reply parsed
 * with the run's tool-call parser. Keeps the observation encoders per tools
 * and template kwargs.
 */
export class GatewayTurns {
  private readonly encoders = new LRUCache<string, ObservationEncoder>({ max: 64 });
  private readonly turnLoop: TurnRunner;

  /** `modelName`: the model replies report; `wall`: epoch milliseconds (a reply's `created`). */
  constructor(
    private readonly opts: GatewayTurnOptions,
    private readonly modelName: string,
    private readonly wall: () => number,
  ) {
    this.turnLoop = new TurnRunner(opts);
  }

  /**
   * One answered call as an event, applied to `st` (the output continued or
   * opened, the tokens and reply recorded): the caller commits it.
   * @throws SessionLimitError (409) when opening an output past `limits.max_outputs_per_session`; engine errors.
   */
  async answer(st: AgentSessionState, req: ChatRequest, hash: string, o: AnswerOptions = {}): Promise<TurnEvent> {
    const tok = this.opts.tokenizer;
    const input = st.input;
    const rollout = input.rollout;
    const tools = req.tools && req.tools.length ? req.tools : undefined;
    let plan = planTurn(st, req.messages, toolsKeyOf(tools), o.role);
    let obsIds: number[] | null = null;
    // An observation with images (a vision-language family): its images with spans, and the data URIs sent to the engine.
    let obsImages: { images: ReturnType<typeof encodeImageObservation>["images"]; data: string[] } | null = null;
    let added: ChatMessage[] = [];
    if (plan.kind === "continue" || (plan.kind === "branch" && plan.point === "after")) {
      const base = plan.kind === "continue" ? plan.out : plan.parent;
      const at = plan.kind === "continue" ? base.builder.contextLength : plan.at;
      added = namedToolResults(plan.added, base.messages.slice(0, plan.kind === "continue" ? base.messages.length : plan.messages));
      // A turn a stop string (or max_tokens) ended has no stop id: close it as the template closes a turn;
      // the agent sent it back as a finished message.
      const lastId = tokenAt(base.builder, at - 1);
      try {
        if (hasMultimodalContent(added)) {
          // Fields name the request's messages: the added ones are its last.
          const first = req.messages.length - added.length;
          const paths = imagePaths(added, first);
          const images = (await asSent(paths, () => resolveImages(tok, added, { prefix: "messages" }), first)).map((img) => ({ ...img, field: sentField(paths, img.field, first) }));
          const encoder = imageObservationEncoder(tok, { ...(tools ? { tools } : {}), chatTemplateKwargs: rollout.chat_template_kwargs });
          const obs = encodeImageObservation(encoder, tok, added, images, lastId, at, "messages", { closeTurn: !tok.isStopToken(lastId) });
          obsIds = obs.ids;
          obsImages = { images: obs.images, data: images.map(imageDataUri) };
        } else {
          obsIds = this.encoder(tools, rollout.chat_template_kwargs).encode(added, lastId, { closeTurn: !tok.isStopToken(lastId) });
        }
      } catch (e) {
        // A combination the template cannot render incrementally (Gemma 3: two user turns in a row): a fresh render.
        if (!(e instanceof TemplateError)) throw e;
        plan = { kind: "root" };
      }
    }
    const partial: Omit<TurnEvent, "reply" | "assistant" | "metrics" | "finish_reason" | "terminated_by" | "ended" | "mark_truncated" | "tool_calls" | "user_turns"> = { e: "turn", hash, ...(o.idempotencyKey !== undefined ? { idem: o.idempotencyKey } : {}) };
    let out: AgentOutputState;
    let truncatedByObs = false;
    if (plan.kind === "continue") {
      out = plan.out;
      // The agent continued from its last reply: it did receive it.
      out.abandoned = null;
      if (out.index !== st.outputs.length - 1) partial.output = out.index;
    } else {
      // (checkLimits saw a continuation the template then could not render incrementally: still no output past the cap.)
      const maxOutputs = (this.opts.limits ?? DEFAULT_SESSION_LIMITS).maxOutputs;
      if (st.outputs.length >= maxOutputs) throw new SessionLimitError(input.key, "max_outputs_per_session", maxOutputs);
      const maxModelLen = await contextSize(rollout, this.opts.maxModelLen, this.opts.client);
      const budgets = { response_length: rollout.response_length, max_model_len: maxModelLen, prompt_length: rollout.prompt_length, track_logprobs: input.sampling_params.logprobs, tools: tools ?? null, ...(o.role ? { agent_role: o.role.name, served_model: o.role.servedModel } : {}) };
      let open: OpenOutput;
      if (plan.kind === "branch" && plan.point !== "prompt") {
        open = { branch: { parent: plan.parent.index, at: plan.at, messages: plan.messages }, prompt_ids: "", prompt_truncated: false, ...budgets, messages: [] };
      } else if (hasMultimodalContent(req.messages)) {
        // A prompt with images: placeholders expanded, the images' spans and data URIs stored with the output. Always a
        // fresh root: a branch in a prompt would have to split the images between parent and branch.
        const paths = imagePaths(req.messages, 0);
        const vp = await asSent(paths, () => visionPrompt(tok, req.messages, { promptLength: rollout.prompt_length, ...(tools ? { tools } : {}), chatTemplateKwargs: rollout.chat_template_kwargs, imageTruncation: "drop", prefix: "messages" }), 0);
        if (vp.truncated) throw promptTooLong(rollout.prompt_length);
        if (vp.promptIds.length >= maxModelLen) throw contextTooLong(vp.promptIds.length, maxModelLen);
        for (const img of vp.multiModal.images) img.field = sentField(paths, img.field, 0);
        open = { prompt_ids: encodeInt32(vp.promptIds), prompt_truncated: false, ...budgets, messages: req.messages, multi_modal: vp.multiModal, image_data: vp.imageData };
      } else {
        const { promptIds, truncated } = buildPromptIds(tok, req.messages, { tools, promptLength: rollout.prompt_length, chatTemplateKwargs: rollout.chat_template_kwargs });
        // An agent's context is what it sent: a prompt cut to fit would be sampled (and trained on) as a context the agent
        // never had, so it is refused as OpenAI and Anthropic refuse an over-long prompt (400, context_length_exceeded).
        if (truncated) throw promptTooLong(rollout.prompt_length);
        if (promptIds.length >= maxModelLen) throw contextTooLong(promptIds.length, maxModelLen);
        const at = plan.kind === "branch" && !truncated && !plan.parent.vision ? this.promptBranchAt(plan.parent, req.messages, plan.messages, promptIds, tools, rollout.chat_template_kwargs) : null;
        open = plan.kind === "branch" && at !== null
          ? { branch: { parent: plan.parent.index, at, messages: plan.messages }, prompt_ids: encodeInt32(promptIds.slice(at)), prompt_truncated: false, ...budgets, messages: req.messages.slice(plan.messages) }
          : { prompt_ids: encodeInt32(promptIds), prompt_truncated: truncated, ...budgets, messages: req.messages };
      }
      partial.open = open;
      out = openOutput(st, open);
    }
    if (obsIds && obsImages) {
      // Cut, when over the budget, before the first image that does not fit whole; the event holds the ids appended.
      const r = appendImageObservation(out.builder, { ids: obsIds, images: obsImages.images });
      const kept = r.images.map((img) => obsImages!.data[obsImages!.images.indexOf(img)]!);
      partial.added = added;
      partial.obs = encodeInt32(obsIds.slice(0, r.appended));
      if (r.images.length > 0) {
        partial.images = r.images;
        partial.image_data = kept;
        const { images: _i, dropped_images: _d, ...meta } = multiModalField(tok, []);
        if (!out.vision) partial.vision = meta;
        addImages(out, r.images, kept, meta);
      }
      out.messages.push(...added);
      truncatedByObs = r.truncated;
      out.userTurns++;
    } else if (obsIds) {
      partial.added = added;
      partial.obs = encodeInt32(obsIds);
      out.messages.push(...added);
      truncatedByObs = out.builder.appendObservation(obsIds).truncated;
      out.userTurns++;
    }
    const mark = beginTurnMark(out);
    const b = out.builder;
    const metrics = { ...out.metrics };
    let finish: TurnEvent["finish_reason"] = "stop";
    let by = "agent";
    let ended = false;
    let markTruncated = false;
    let replyFinish: ChatReply["finish_reason"] = "stop";
    let action: { ids: number[]; lps: number[] | null } | null = null;
    let modelVersion: unknown = null;
    let versions: TokenVersions | null = null;
    let experts: TurnEvent["experts"];
    const promptTokens = b.contextLength;
    const created = Math.floor(this.wall() / 1000);
    const replyId = (turns: number) => `chatcmpl-${fnv1a32(input.key).toString(16)}-${out.index}-${turns}-${st.step + 1}`;
    const thinkOpened = promptOpensThink(tok, b.contextIds());
    if (truncatedByObs) {
      [finish, by, ended, markTruncated, replyFinish] = ["length", "response_length", true, true, "length"];
    } else {
      let sp = samplingFor(input.sampling_params, req);
      if (o.resample && req.seed === undefined && sp.seed !== undefined) sp = { ...sp, seed: resampleSeed(sp.seed, out.index) };
      let onTokens: ((ids: number[]) => void) | undefined;
      if (o.sink) {
        const format = rollout.multi_turn.format ?? tok.traits.defaultParser;
        const markers = req.tool_choice === "none" ? [] : (Object.hasOwn(STREAM_MARKERS, format) ? STREAM_MARKERS[format]! : null);
        const maxTokens = req.max_tokens === undefined ? b.nextMaxTokens() : Math.min(b.nextMaxTokens(), req.max_tokens);
        // A turn that streams has sampled tokens, so its reply counts one more assistant turn.
        const head = { id: replyId(out.assistantTurns + 1), created, model: req.model ?? this.modelName, prompt_tokens: promptTokens };
        const ts = new TurnStream(tok, { family: tok.traits.family, markers, ...(req.stop?.length ? { stop: req.stop } : {}), thinkOpened, maxTokens }, o.sink, head);
        onTokens = (ids) => ts.push(ids);
      }
      const r = await this.turnLoop.generate(b, sp, input.key, metrics, req.max_tokens, rollout.return_routed_experts, onTokens, out.vision?.imageData);
      if (r === undefined || r === "overflow" || r === "aborted") {
        [finish, by, ended, markTruncated, replyFinish] = r === "aborted" ? ["abort", "abort", true, false, "length"] : ["length", b.remainingBudget <= 0 ? "response_length" : "max_model_len", true, true, "length"];
      } else {
        addPreempted(metrics, r.num_preempted);
        // The engine's (or the gate's stamped) version, else the batch's.
        modelVersion = modelVersionOf(r) ?? input.model_version;
        const lps = input.sampling_params.logprobs ? r.log_probs : null;
        const offset = b.responseLength;
        const appended = b.appendAction(r.token_ids, lps);
        experts = routedExpertsDelta(b, r.routed_experts);
        const kept = r.token_ids.slice(0, appended.appended);
        versions = turnVersions(r)
          .filter(([start]) => start < kept.length)
          .map(([start, v]) => [start, v ?? input.model_version] as [number, unknown]);
        recordActionVersions(out.tokenVersions, offset, kept.length, versions);
        action = { ids: kept, lps: lps ? lps.slice(0, appended.appended) : null };
        out.assistantTurns++;
        out.lastAction = { turn: out.assistantTurns, start: offset, end: b.responseLength };
        out.modelVersions.push(modelVersion);
        out.lastActionIds = Int32Array.from(kept);
        replyFinish = r.finish_reason === "length" || appended.truncated ? "length" : "stop";
        if (r.finish_reason === "abort") [finish, by, ended, replyFinish] = ["abort", "abort", true, "length"];
        else if (appended.truncated) [finish, by, ended, markTruncated] = ["length", "response_length", true, true];
        else if (b.remainingBudget <= 0 || b.contextLength >= b.maxModelLen) [finish, by, ended, markTruncated] = ["length", "response_length", true, true];
        else if (r.finish_reason === "length" && (req.max_tokens === undefined || kept.length < req.max_tokens)) [finish, by, ended, markTruncated] = ["length", "length_stop", true, true];
        const maxTurns = rollout.multi_turn.max_assistant_turns;
        if (!ended && maxTurns != null && out.assistantTurns >= maxTurns) [finish, by, ended] = ["stop", "max_assistant_turns", true];
      }
    }
    if (markTruncated) b.markTruncated();
    // The builder's cut flag as the fold must see it (an append cut by a budget sets it too).
    markTruncated = b.truncated;
    const parsed = action
      ? parseReply(tok, this.parser(rollout.multi_turn.format, tools), action.ids, { toolChoice: req.tool_choice, session: sessionTag(input.key), outputIndex: out.index, turn: out.assistantTurns - 1, thinkOpened, ...(replyFinish === "stop" && req.stop?.length ? { stop: req.stop } : {}) })
      : null;
    if (parsed?.message.tool_calls?.length && replyFinish === "stop") replyFinish = "tool_calls";
    const message = parsed?.message ?? { role: "assistant" as const, content: "" };
    const reply: ChatReply = {
      id: replyId(out.assistantTurns),
      created,
      model: req.model ?? this.modelName,
      message,
      finish_reason: replyFinish,
      ...(parsed?.stop_sequence !== undefined ? { stop_sequence: parsed.stop_sequence } : {}),
      usage: { prompt_tokens: promptTokens, completion_tokens: action?.ids.length ?? 0, total_tokens: promptTokens + (action?.ids.length ?? 0) },
      ...(req.logprobs ? { logprobs: action ? this.logprobsOf(action.ids, action.lps) : [] } : {}),
    };
    const assistant: ChatMessage | null = parsed?.history ?? null;
    if (assistant) out.messages.push(assistant);
    out.toolCalls += parsed?.calls.length ?? 0;
    out.metrics = metrics;
    out.finishReason = finish;
    out.terminatedBy = by;
    out.ended = ended;
    if (action) endTurnMark(out, mark);
    out.last = { hash, reply };
    rememberReply(st, hash, reply);
    if (o.idempotencyKey !== undefined) rememberKey(st, o.idempotencyKey, hash, reply);
    return {
      ...partial,
      ...(action ? { action: { ids: encodeInt32(action.ids), lps: action.lps ? encodeFloat32(action.lps) : null }, model_version: modelVersion, versions: versions ?? [] } : {}),
      ...(experts ? { experts } : {}),
      mark_truncated: markTruncated,
      ended,
      finish_reason: finish,
      terminated_by: by,
      assistant,
      reply: reply as unknown as Record<string, unknown>,
      metrics,
      tool_calls: parsed?.calls.length ?? 0,
      user_turns: out.userTurns,
    };
  }

  /**
   * Where a branch in `parent`'s prompt starts, checked by tokens: the render
   * of the shared `shared` messages (no generation prompt) must be a prefix
   * of both the parent's prompt ids and the request's fresh render
   * `promptIds`; then its length, else null (a fresh root).
   */
  private promptBranchAt(parent: AgentOutputState, messages: readonly ChatMessage[], shared: number, promptIds: readonly number[], tools: ToolSchema[] | undefined, kwargs: Record<string, unknown> | undefined): number | null {
    let prefix: number[];
    try {
      prefix = this.opts.tokenizer.renderIds(messages.slice(0, shared), { tools, addGenerationPrompt: false, chatTemplateKwargs: kwargs });
    } catch (e) {
      if (e instanceof TemplateError) return null;
      throw e;
    }
    const theirs = parent.builder.promptIds;
    if (prefix.length === 0 || prefix.length >= promptIds.length || prefix.length >= theirs.length) return null;
    for (let i = 0; i < prefix.length; i++) if (prefix[i] !== promptIds[i] || prefix[i] !== theirs[i]) return null;
    return prefix.length;
  }

  private logprobsOf(ids: number[], lps: number[] | null): NonNullable<ChatReply["logprobs"]> {
    const enc = new TextEncoder();
    return ids.map((id, i) => {
      const token = this.opts.tokenizer.decode([id]);
      return { token, logprob: lps?.[i] ?? 0, bytes: Array.from(enc.encode(token)) };
    });
  }

  private parser(format: string | null, tools: ToolSchema[] | undefined) {
    return createToolCallParser(format ?? this.opts.tokenizer.traits.defaultParser, { tools });
  }

  private encoder(tools: ToolSchema[] | undefined, kwargs: Record<string, unknown> | undefined): ObservationEncoder {
    const k = `${toolsKeyOf(tools)}\u0000${JSON.stringify(kwargs ?? {})}`;
    let e = this.encoders.get(k);
    if (!e) {
      e = new ObservationEncoder(this.opts.tokenizer, { tools, chatTemplateKwargs: kwargs });
      this.encoders.set(k, e);
    }
    return e;
  }
}

/**
 * The 400 for a call whose rendered prompt (messages ‖ tools, with the
 * generation prompt) is longer than `rollout.prompt_length` tokens: code
 * `context_length_exceeded` (OpenAI's code for an over-long prompt), field
 * `messages`. The gateway never left-truncates an agent's context.
 */
export function promptTooLong(promptLength: number): InputError {
  return new InputError(
    "messages",
    `the rendered prompt (messages and tools) is longer than rollout.prompt_length (${promptLength} tokens), and the agent gateway never cuts an agent's context: send less, or raise rollout.prompt_length (--prompt-length)`,
    { code: "context_length_exceeded" },
  );
}

/**
 * The request paths of the image parts of `messages` (the request's messages from index `first` on),
 * by the gateway's field prefix `messages[m].content[p]` (m counted from `first`): what the wire
 * parser recorded ({@link IMAGE_PART_PATHS}); parts it did not make (a previous response's) are absent.
 */
function imagePaths(messages: readonly ChatMessage[], first: number): Map<string, string> {
  const out = new Map<string, string>();
  messages.forEach((m, i) => {
    if (!Array.isArray(m.content)) return;
    m.content.forEach((part, j) => {
      const path = IMAGE_PART_PATHS.get(part);
      if (path) out.set(`messages[${i + first}].content[${j}]`, path);
    });
  });
  return out;
}

/** An image field of the gateway's (`messages[m].content[p]…`, m relative to `first`) as the request named it. */
function sentField(paths: Map<string, string>, field: string, first: number): string {
  const m = /^messages\[(\d+)\](\.content\[\d+\])/.exec(field);
  if (!m) return field;
  const own = `messages[${Number(m[1]) + first}]${m[2]}`;
  return paths.get(own) ?? own + field.slice(m[0].length);
}

/** Runs `fn`; an InputError about an image is thrown again naming the image as the request sent it ({@link sentField}). */
async function asSent<T>(paths: Map<string, string>, fn: () => Promise<T>, first: number): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (!(e instanceof InputError) || !e.field) throw e;
    const field = sentField(paths, e.field, first);
    if (field === e.field) throw e;
    throw new InputError(field, e.message.slice(e.field.length + 2), { cause: e });
  }
}

/**
 * The 400 for a call whose rendered prompt leaves no room to sample within the model's context
 * (`max_model_len`, from the rollout config or the engine): code `context_length_exceeded`, field `messages`.
 */
export function contextTooLong(promptTokens: number, maxModelLen: number): InputError {
  return new InputError("messages", `the rendered prompt holds ${promptTokens} tokens and the model's context is ${maxModelLen} (max_model_len): no room to sample; send less`, { code: "context_length_exceeded" });
}

/** The id at token index `i` of `b`'s prompt ‖ response (undefined outside it). */
function tokenAt(b: TrajectoryBuilder, i: number): number | undefined {
  const P = b.promptIds.length;
  if (i < 0 || i >= b.contextLength) return undefined;
  return i < P ? b.promptIds[i] : b.responseSlice(i - P).ids[0];
}

/** The batch's sampling parameters with the request's `temperature`, `top_p`, `seed` and `stop` over them (log-probs as the run records them). */
export function samplingFor(base: SamplingParams, req: ChatRequest): SamplingParams {
  return {
    ...base,
    ...(req.temperature !== undefined ? { temperature: req.temperature } : {}),
    ...(req.top_p !== undefined ? { top_p: req.top_p } : {}),
    ...(req.seed !== undefined ? { seed: req.seed } : {}),
    ...(req.stop?.length ? { stop: req.stop } : {}),
  };
}

/**
 * The seed of a resample opening output `outputIndex` of a session sampled at
 * `seed`: at the session's own seed vLLM and SGLang would return the very
 * tokens of the call it repeats. Deterministic (a rerun repeats it), in
 * [0, 2^31 − 1), as the executor derives per-trajectory seeds.
 */
export function resampleSeed(seed: number, outputIndex: number): number {
  return (((seed * 1_000_003 + (outputIndex + 1) * 7_919) % 2_147_483_647) + 2_147_483_647) % 2_147_483_647;
}

/**
 * Applies a call's routed experts to `b` and returns what changed, for the
 * turn event: the positions from the first changed one to the end of
 * prompt ‖ response (a later call re-covers earlier positions with the same
 * values, so this is normally the new tokens and the observation before
 * them), base64 int32. Undefined when the call returned none.
 */
function routedExpertsDelta(b: TrajectoryBuilder, span: RoutedExpertsSpan | undefined): TurnEvent["experts"] {
  if (!span) return undefined;
  b.markExpertsCommitted();
  b.applyRoutedExperts(span);
  const now = b.routedExperts()!;
  const per = now.shape[0] * now.shape[1];
  const from = b.routedExpertsChangedFrom(now.data.length / per);
  return { from, data: encodeInt32(now.data.subarray(from * per)), shape: now.shape };
}

/** The loop machinery a call reuses: `AgentLoop.generate` (preemption resume, stop ids, token versions). */
class TurnRunner extends AgentLoop {
  constructor(opts: GatewayTurnOptions) {
    super({ tokenizer: opts.tokenizer, client: opts.client, config: undefined as unknown as AgentLoopContext["config"], maxModelLen: opts.maxModelLen, newRequestId: opts.newRequestId });
  }
  run(): Promise<AgentLoopOutput> {
    throw new EdgeloopError("not a loop", { status: 500, code: "internal" });
  }
  override generate(...a: Parameters<AgentLoop["generate"]>) {
    return super.generate(...a);
  }
}
