import { ConfigError, InputError } from "../errors.ts";
import { redactUrl, type OutboundFetch } from "../http/outbound.ts";
import type { AgentLoopOutput, ChatMessage, SamplingParams } from "../schema/index.ts";
import { OpenEnvRowSettings, OpenEnvSettings, SANDBOX_BASE_URL, type OpenEnvResult } from "../schema/openenv.ts";
import { sandboxKwargsOf } from "../tools/sandbox-leases.ts";
import { createToolCallParser } from "../tools/parser-registry.ts";
import type { ParsedCall, ParseError, ToolCallParser } from "../tools/tool-call-parser.ts";
import { isPlainObject } from "../tools/json-aware-scan.ts";
import { visibleSpans } from "../tools/reasoning-spans.ts";
import { sharedObservationEncoder } from "./encoder-cache.ts";
import { finalTokenVersions, type AgentLoopKwargs } from "./agent-loop.ts";
import { OpenEnvError, openEpisode, type OpenEnvEpisode, type OpenEnvSocketFactory } from "./openenv-client.ts";
import { ToolAgentLoop, type ToolAgentData, type ToolAgentState } from "./tool-agent.ts";

/**
 * What `openenv_agent` needs from its process: the `openenv` config section
 * and, for tests and embedders, the `fetch` and `WebSocket` it uses
 * (defaults: the global ones).
 */
export interface OpenEnvLink {
  settings: OpenEnvSettings;
  fetch?: OutboundFetch;
  webSocket?: OpenEnvSocketFactory;
}

declare module "./agent-loop.ts" {
  interface AgentLoopContext {
    /** The `openenv` config section (and transports) `openenv_agent` runs with; absent: the section's defaults. */
    openenv?: OpenEnvLink;
  }
}

/** The name of the pending "call" that stands for one `step` in the run state (checkpoints store it like a tool call). */
const STEP = "openenv.step";

/** At most this many `{…}` candidates are tried when looking for a JSON action in a turn's text (keeps the scan linear). */
const MAX_JSON_CANDIDATES = 8;

/**
 * The row's effective settings: the configured section with the row's
 * `extra_info.openenv` over it ({@link OpenEnvRowSettings}).
 * @throws InputError naming `extra_info.openenv.<field>`, or `extra_info.openenv.base_url` when neither gives a URL.
 */
export function openEnvSettingsFor(configured: OpenEnvSettings | undefined, extraInfo: unknown): OpenEnvSettings & { base_url: string } {
  const base = configured ?? OpenEnvSettings.parse({});
  const raw = isPlainObject(extraInfo) ? extraInfo.openenv : undefined;
  let row: OpenEnvRowSettings = {};
  if (raw !== undefined && raw !== null) {
    const r = OpenEnvRowSettings.safeParse(raw);
    if (!r.success) {
      const i = r.error.issues[0]!;
      const path = i.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("");
      throw new InputError(`extra_info.openenv${path}`, i.message);
    }
    row = r.data;
  }
  const merged: OpenEnvSettings = {
    ...base,
    ...stripUndefined(row),
    reset_kwargs: { ...base.reset_kwargs, ...(row.reset_kwargs ?? {}) },
    action: { ...base.action, ...stripUndefined(row.action ?? {}) },
    observation: { ...base.observation, ...stripUndefined(row.observation ?? {}) },
  } as OpenEnvSettings;
  if (!merged.base_url) throw new InputError("extra_info.openenv.base_url", "no OpenEnv environment URL: set openenv.base_url in the config or extra_info.openenv.base_url in the row");
  return merged as OpenEnvSettings & { base_url: string };
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * The value at a dotted `path` of `obj` (`a.b.0.c`; numeric segments index
 * arrays), or undefined when a segment is missing.
 */
export function valueAtPath(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  for (const seg of path.split(".")) {
    if (Array.isArray(cur) && /^\d+$/.test(seg)) cur = cur[Number(seg)];
    else if (isPlainObject(cur) && Object.hasOwn(cur, seg)) cur = cur[seg];
    else return undefined;
  }
  return cur;
}

/** An observation's turn text: the value at `field` (a string as it is, anything else as JSON), else the whole observation's JSON. */
export function observationText(observation: Record<string, unknown>, field: string | null): string {
  const v = field === null ? undefined : valueAtPath(observation, field);
  if (v === undefined) return JSON.stringify(observation);
  return typeof v === "string" ? v : JSON.stringify(v);
}

/**
 * The first JSON object in `text`: the whole text, else a fenced
 * ```` ```json ```` (or bare ```` ``` ````) block, else the first balanced `{…}`
 * (strings respected) that parses — at most {@link MAX_JSON_CANDIDATES} tried,
 * so the scan stays linear in the text. Null when there is none.
 */
export function firstJsonObject(text: string): Record<string, unknown> | null {
  const whole = tryObject(text.trim());
  if (whole) return whole;
  const fence = /```(?:json)?[ \t]*\n([\s\S]*?)```/.exec(text);
  if (fence) {
    const f = tryObject(fence[1]!.trim());
    if (f) return f;
  }
  let from = 0;
  for (let n = 0; n < MAX_JSON_CANDIDATES; n++) {
    const start = text.indexOf("{", from);
    if (start < 0) return null;
    const end = balancedEnd(text, start);
    if (end < 0) return null;
    const o = tryObject(text.slice(start, end + 1));
    if (o) return o;
    from = start + 1;
  }
  return null;
}

function tryObject(s: string): Record<string, unknown> | null {
  if (!s.startsWith("{")) return null;
  try {
    const v = JSON.parse(s) as unknown;
    return isPlainObject(v) ? v : null;
  } catch {
    return null;
  }
}

/** Index of the `}` closing the `{` at `start` (JSON strings skipped), or −1. */
function balancedEnd(text: string, start: number): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === "{") depth++;
    else if (c === "}" && --depth === 0) return i;
  }
  return -1;
}

/**
 * Why an `openenv_agent` trajectory ended (`extra_fields.terminated_by`), on
 * top of `tool_agent`'s budget and limit reasons (`response_length`,
 * `max_model_len`, `length_stop`, `max_assistant_turns`, `max_user_turns`,
 * `multi_turn_disabled`, `abort`): `env_done` (a step, or the reset, said
 * `done`), `env_terminated` / `env_truncated` (a server that sends
 * Gymnasium's `terminated` / `truncated` said so), `invalid_action`
 * (`action.on_invalid: end`).
 */
export type OpenEnvTerminatedBy = "env_done" | "env_terminated" | "env_truncated" | "invalid_action";

/**
 * `openenv_agent`: an OpenEnv environment as the agent loop. Per trajectory:
 *
 * 1. pending: `reset` (WebSocket: connect to `{base}/ws`, one environment for
 *    this trajectory; HTTP: `POST {base}/reset`) with `openenv.reset_kwargs`
 *    and `episode_id` = the trajectory key; its observation is appended to
 *    (or merged into) the row's prompt (`observation.reset`; the row's prompt
 *    may be absent), which is rendered with the chat template
 *    (`action.tools` when given). A reset that says `done` ends the
 *    trajectory at once (no engine call).
 * 2. generating: one engine call, sampled ids appended exactly (mask 1,
 *    their log-probs); the turn becomes the action (`action.format`). A turn
 *    the engine cut on its length limit is not acted on (ends `length_stop`).
 * 3. processing_tools: exactly one `step` per action (HTTP: `POST {base}/step`
 *    `{"action", "request_id": "{key}:{turn}"}`); its `reward` (null → 0) is
 *    appended to `turn_scores`. `done`, `terminated` or `truncated` ends the
 *    trajectory (the final observation is counted as a user turn but not
 *    appended: no trailing mask-0 tokens). Else the limits of
 *    `rollout.multi_turn` (`max_assistant_turns`, `max_user_turns`, `enable`)
 *    and the response budget are checked, and the observation text
 *    (`observation.field`) is encoded incrementally as a `user` (or `tool`)
 *    turn — mask 0, log-prob 0, exactly as `tool_agent` appends observations
 *    — and the loop generates again. A turn without an action gets an error
 *    observation and no step (`action.on_invalid: observe`) or ends the
 *    trajectory (`end`).
 * 4. terminated: `reward_score` = the sum of `turn_scores` (`reward: sum`, the
 *    episode return, as OpenEnv's examples accumulate `result.reward or 0`),
 *    the last one (`last`), or the row's `reward_model` (`row`); null when
 *    rewards are off. The WebSocket is closed.
 *
 * An environment failure (connection, HTTP status, timeout, a reply that is
 * not the protocol's JSON, a server `error` message) throws an
 * {@link OpenEnvError} naming the environment's URL: that one trajectory
 * fails, the batch goes on.
 *
 * Per-episode containers (`openenv.base_url: "sandbox"`): before the reset
 * the trajectory's sandbox lease is ensured (`ctx.leases`, fresh: nothing of
 * the environment observed yet; create_kwargs = the row's
 * `extra_info.sandbox_kwargs`), and every call goes to the lease's
 * `base_url` (the provider's create reply; kept in the lease record, so a
 * session resumed elsewhere reaches the same server). A lease without
 * `base_url` fails the trajectory (`OpenEnvError`, code
 * `openenv_no_base_url`); no `ctx.leases` (no sandbox block in the tools
 * file) throws a ConfigError naming `openenv.base_url`. The executor releases
 * the lease when the trajectory ends.
 *
 * Durable sessions: this is a `tool_agent` state machine (same states, same
 * run state), so a session checkpoints it after every transition and a
 * resumed session never re-sends a `step` whose result it committed (the
 * step and its observation are one commit; a step in flight at a crash is
 * sent again with the same `request_id`). A WebSocket episode lives in its
 * connection: a session resumed in another process cannot continue it and
 * fails with an `OpenEnvError` saying so; over HTTP the server's own episode
 * state carries on.
 *
 * `extra_fields`: `turn_scores` (one per step), `tool_rewards` (empty),
 * `env_steps`, `invalid_actions`, `terminated_by`, `openenv`
 * (`{url, transport}`, the URL redacted), `model_versions`, `token_versions`,
 * and `error`/`reward_error` as other loops. `num_turns` = user turns
 * (observations, the final one included) + assistant turns + 1.
 * @see OpenEnv `EnvClient` / `HTTPEnvServer` (meta-pytorch/OpenEnv, `openenv-core` 0.2.3)
 */
export class OpenEnvAgentLoop extends ToolAgentLoop {
  private episode: OpenEnvEpisode | null = null;
  /** The environment URL this trajectory's sandbox lease named (`base_url: "sandbox"`), once known. */
  private sandboxUrl: string | null = null;
  /** Set by {@link reattach}: the run state comes from a checkpoint written by another loop instance. */
  private resumed = false;
  private actionParser: ToolCallParser | null = null;

  override async run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput> {
    try {
      return await super.run(samplingParams, kwargs);
    } finally {
      this.closeEpisode();
    }
  }

  override async advance(state: ToolAgentState, d: ToolAgentData): Promise<ToolAgentState> {
    try {
      return await super.advance(state, d);
    } catch (e) {
      this.closeEpisode();
      throw e;
    }
  }

  override reattach(d: ToolAgentData): void {
    this.resumed = true;
    d.encoder = sharedObservationEncoder(this.ctx.tokenizer, this.promptTools(d), this.ctx.config.chat_template_kwargs);
  }

  /** The row's prompt messages, validated; an absent prompt is an empty list (the reset observation can be the whole prompt). */
  protected override messages(kwargs: AgentLoopKwargs): ChatMessage[] {
    if (kwargs.prompt === undefined && kwargs.raw_prompt === undefined) return [];
    return super.messages(kwargs);
  }

  private settings(d: ToolAgentData): OpenEnvSettings & { base_url: string } {
    return openEnvSettingsFor(this.ctx.openenv?.settings, d.kwargs.extra_info);
  }

  private promptTools(d: ToolAgentData) {
    const s = this.settings(d);
    return s.action.format === "tool_call" && s.action.tools.length > 0 ? s.action.tools : undefined;
  }

  /**
   * The environment's base URL: the configured (or row's) one, or with
   * `"sandbox"` the `base_url` of the trajectory's sandbox lease, ensured here
   * (`fresh`: before the reset, when nothing of the environment was observed).
   * @throws ConfigError naming `openenv.base_url` without sandbox leases;
   *   OpenEnvError (`openenv_no_base_url`) for a lease without `base_url`;
   *   the lease manager's SandboxCreateError / SandboxLostError.
   */
  private async baseUrl(d: ToolAgentData, s: OpenEnvSettings & { base_url: string }, fresh: boolean): Promise<string> {
    if (s.base_url !== SANDBOX_BASE_URL) return s.base_url;
    if (this.sandboxUrl) return this.sandboxUrl;
    const leases = this.ctx.leases;
    if (!leases) throw new ConfigError("openenv.base_url", `"${SANDBOX_BASE_URL}" plays each trajectory's own sandbox, but there are no sandbox leases: add a sandbox block to the tools file (tools.file), or set an environment URL`);
    const lease = await leases.ensure(d.key, sandboxKwargsOf(d.kwargs as { extra_info?: unknown }), { fresh, ...(this.ctx.signal ? { signal: this.ctx.signal } : {}) });
    if (!lease.base_url) {
      throw new OpenEnvError(
        `openenv: sandbox ${lease.sandbox_id} (lease ${lease.lease_id}) has no base_url: with openenv.base_url "${SANDBOX_BASE_URL}" the sandbox provider's create reply must carry base_url (the http(s) URL of the OpenEnv server in that sandbox)`,
        { code: "openenv_no_base_url" },
      );
    }
    this.sandboxUrl = lease.base_url;
    return lease.base_url;
  }

  /** The URL records and messages name (redacted by the caller): the resolved sandbox URL when there is one. */
  private shownUrl(d: ToolAgentData, s: OpenEnvSettings & { base_url: string }): string {
    if (s.base_url !== SANDBOX_BASE_URL) return s.base_url;
    return this.sandboxUrl ?? this.ctx.leases?.leaseOf(d.key)?.base_url ?? SANDBOX_BASE_URL;
  }

  /** The episode's client; a WebSocket episode cannot be picked up from another instance's checkpoint. */
  private async env(d: ToolAgentData, fresh = false): Promise<OpenEnvEpisode> {
    if (this.episode) return this.episode;
    const s = this.settings(d);
    if (this.resumed && s.transport === "websocket") {
      throw new OpenEnvError(
        `openenv ${redactUrl(this.shownUrl(d, s))}: the trajectory resumed from a checkpoint, but its WebSocket episode lived in the connection of the process that started it; an OpenEnv WebSocket episode cannot be continued (use transport http with a server that keeps episode state to resume)`,
        { code: "openenv_session_lost" },
      );
    }
    const url = await this.baseUrl(d, s, fresh);
    // Another call may have opened it while the lease was ensured.
    if (this.episode) return this.episode;
    this.episode = openEpisode(url, {
      transport: s.transport,
      timeoutMs: s.timeout_ms,
      maxBytes: s.max_message_bytes,
      ...(this.ctx.openenv?.fetch ? { fetch: this.ctx.openenv.fetch } : {}),
      ...(this.ctx.openenv?.webSocket ? { webSocket: this.ctx.openenv.webSocket } : {}),
    });
    return this.episode;
  }

  private closeEpisode(): void {
    this.episode?.close();
    this.episode = null;
  }

  /** Reset, then the prompt (row prompt + reset observation) and the builder. */
  protected override async onPending(d: ToolAgentData): Promise<ToolAgentState> {
    const { config, tokenizer } = this.ctx;
    const s = this.settings(d);
    const tools = this.promptTools(d);
    d.encoder = sharedObservationEncoder(tokenizer, tools, config.chat_template_kwargs);
    const fields: Record<string, unknown> = { ...(d.key.length <= 255 ? { episode_id: d.key } : {}), ...s.reset_kwargs };
    const t0 = this.now();
    let res: OpenEnvResult;
    try {
      res = await (await this.env(d, true)).reset(fields, this.ctx.signal);
    } finally {
      d.metrics.tool_calls += Math.max(0, (this.now() - t0) / 1000);
    }
    const text = observationText(res.observation, s.observation.reset_field ?? s.observation.field);
    const mode = s.observation.reset;
    const last = d.messages[d.messages.length - 1];
    if (mode === "merge" && last?.role === "user" && typeof last.content === "string") {
      d.messages[d.messages.length - 1] = { ...last, content: `${last.content}\n\n${text}` };
    } else if (mode !== "ignore") d.messages.push({ role: "user", content: text });
    if (d.messages.length === 0) throw new InputError("prompt", "openenv_agent: the row has no prompt and observation.reset is 'ignore': nothing to render");
    await this.openBuilder(d, tools);
    if (res.done || res.terminated || res.truncated) return this.stopAs(d, doneReason(res));
    return "generating";
  }

  /** One assistant turn, then its action (or why it has none) as the pending step. */
  protected override async onGenerating(d: ToolAgentData): Promise<ToolAgentState> {
    await this.env(d);
    const b = d.builder!;
    const tok = this.ctx.tokenizer;
    await this.checkStaleness(d.modelVersions);
    const out = await this.generate(b, d.samplingParams, d.key, d.metrics);
    if (out === undefined || out === "overflow") return this.stopAs(d, b.remainingBudget <= 0 ? "response_length" : "max_model_len", "length", true);
    if (out === "aborted") return this.stopAs(d, "abort", "abort");
    const appended = this.appendTurn(d, out);
    const ids = out.token_ids;
    const body = ids.length > 0 && tok.isStopToken(ids[ids.length - 1]) ? ids.slice(0, -1) : ids;
    const text = tok.decode(body, { skipSpecialTokens: true });
    d.lastAssistantText = text;
    if (out.finish_reason === "abort") return this.stopAs(d, "abort", "abort");
    if (appended.truncated) return this.stopAs(d, "response_length", "length", true);
    // A turn cut by the engine's length limit is not acted on (C13).
    if (out.finish_reason === "length") return this.stopAs(d, "length_stop", "length", true);

    const s = this.settings(d);
    const a = s.action;
    let action: Record<string, unknown> | null = null;
    let why = "";
    let content = text;
    let call: ParsedCall | undefined;
    if (a.format === "text") action = { [a.field ?? "message"]: visibleText(text) };
    else if (a.format === "json") {
      const o = firstJsonObject(visibleText(text));
      if (o) action = a.field ? { [a.field]: o } : o;
      else why = "no JSON object in the reply; answer with the action as one JSON object";
    } else {
      this.actionParser ??= createToolCallParser(this.ctx.config.multi_turn.format ?? tok.traits.defaultParser, a.tools.length ? { tools: a.tools } : {});
      const parsed = this.actionParser.extract(tok.decode(body));
      content = parsed.content;
      call = parsed.calls[0];
      if (call) action = a.field ? { [a.field]: call.arguments } : call.arguments;
      else why = parsed.errors[0]?.message ?? "no tool call in the reply; call the tool to act";
    }
    d.messages.push({ role: "assistant", content, ...(call ? { tool_calls: [{ type: "function" as const, function: { name: call.name, arguments: call.arguments } }] } : {}) });
    if (action) {
      d.pending = [{ index: 0, name: call?.name ?? STEP, arguments: action, raw: "" } satisfies ParsedCall];
      return "processing_tools";
    }
    d.toolErrors++;
    if (a.on_invalid === "end") return this.stopAs(d, "invalid_action");
    d.pending = [{ index: 0, message: `Error: ${why}.`, raw: "" } satisfies ParseError];
    return "processing_tools";
  }

  /** Exactly one `step` for the pending action (none for an invalid one), then the end or its observation. */
  protected override async onProcessingTools(d: ToolAgentData): Promise<ToolAgentState> {
    const s = this.settings(d);
    const a = d.pending[0];
    d.pending = [];
    d.toolResults = undefined;
    let text: string;
    let name = "openenv";
    if (!a) return "generating";
    if ("arguments" in a) {
      if (a.name !== STEP) name = a.name;
      const t0 = this.now();
      let res: OpenEnvResult;
      try {
        res = await (await this.env(d)).step(a.arguments, `${d.key}:${d.assistantTurns}`, this.ctx.signal);
      } finally {
        d.metrics.tool_calls += Math.max(0, (this.now() - t0) / 1000);
      }
      d.toolCalls++;
      d.turnScores.push(res.reward ?? 0);
      text = observationText(res.observation, s.observation.field);
      if (res.done || res.terminated || res.truncated) {
        d.userTurns++;
        d.messages.push({ role: "user", content: text });
        return this.stopAs(d, doneReason(res));
      }
    } else text = a.message;
    const mt = this.ctx.config.multi_turn;
    const b = d.builder!;
    if (mt.max_assistant_turns != null && d.assistantTurns >= mt.max_assistant_turns) return this.stopAs(d, "max_assistant_turns");
    if (mt.max_user_turns != null && d.userTurns >= mt.max_user_turns) return this.stopAs(d, "max_user_turns");
    if (!mt.enable) return this.stopAs(d, "multi_turn_disabled");
    if (b.remainingBudget <= 0) return this.stopAs(d, "response_length", "length", true);
    const msg: ChatMessage = s.observation.role === "tool" ? { role: "tool", name, content: text } : { role: "user", content: text };
    const ids = d.encoder!.encode([msg], b.lastTokenId);
    d.messages.push(msg);
    d.userTurns++;
    if (b.appendObservation(ids).truncated) return this.stopAs(d, "response_length", "length", true);
    return "generating";
  }

  protected override async onTerminated(d: ToolAgentData): Promise<AgentLoopOutput> {
    this.closeEpisode();
    const s = this.settings(d);
    const scores = d.turnScores;
    let score: number | null;
    let rewardError: string | undefined;
    if (this.ctx.reward === false) score = null;
    else if (s.reward === "row") {
      const r = await this.reward(d.kwargs, d.key, d.lastAssistantText);
      d.metrics.compute_score += r.seconds;
      score = r.score;
      rewardError = r.error;
    } else if (s.reward === "last") score = scores.length ? scores[scores.length - 1]! : 0;
    else score = scores.reduce((x, y) => x + y, 0);
    // Each step's reward is a finite JSON number, but their sum can overflow (1.7e308 twice): named here, with the env,
    // rather than as the record's "reward_score: expected number, received Infinity".
    if (score !== null && !Number.isFinite(score)) {
      throw new OpenEnvError(`openenv ${redactUrl(this.shownUrl(d, s))}: the step rewards sum to ${score} (turn_scores ${JSON.stringify(scores.length > 8 ? [...scores.slice(0, 8), "…"] : scores)}): not a finite number`, { code: "openenv_bad_reply" });
    }
    const extra: Record<string, unknown> = {
      turn_scores: scores,
      tool_rewards: d.toolRewards,
      env_steps: d.toolCalls,
      invalid_actions: d.toolErrors,
      terminated_by: d.terminatedBy,
      openenv: { url: redactUrl(this.shownUrl(d, s)), transport: s.transport },
    };
    if (d.modelVersions.some((v) => v !== null)) extra.model_versions = d.modelVersions;
    const tv = finalTokenVersions(d.tokenVersions, d.builder!.responseLength);
    if (tv) extra.token_versions = tv;
    if (d.error) extra.error = d.error;
    if (rewardError) extra.reward_error = rewardError;
    return d.builder!.finish({
      numTurns: d.userTurns + d.assistantTurns + 1,
      rewardScore: score,
      metrics: d.metrics,
      extraFields: extra,
      finishReason: d.finishReason,
    });
  }

  private stopAs(d: ToolAgentData, by: string, finishReason: ToolAgentData["finishReason"] = "stop", truncated = false): ToolAgentState {
    if (truncated) d.builder!.markTruncated();
    d.finishReason = finishReason;
    d.terminatedBy = by as ToolAgentData["terminatedBy"];
    return "terminated";
  }
}

/** The turn's text outside reasoning (`<think>…</think>` removed, as tool-call parsers skip it), trimmed. */
export function visibleText(text: string): string {
  return visibleSpans(text)
    .map((sp) => text.slice(sp.start, sp.end))
    .join("")
    .trim();
}

function doneReason(r: OpenEnvResult): OpenEnvTerminatedBy {
  if (r.terminated) return "env_terminated";
  if (r.truncated) return "env_truncated";
  return "env_done";
}
