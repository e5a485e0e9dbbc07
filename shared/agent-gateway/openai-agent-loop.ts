import { AgentLoop, type AgentLoopKwargs } from "../agent-loop/agent-loop.ts";
import { ConfigError, EdgeloopError, InputError } from "../errors.ts";
import { AgentRoleName, type AgentLoopOutput, type SamplingParams } from "../schema/index.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES, OutboundHttpError, outboundRequest, redactUrl } from "../http/outbound.ts";
import { SIGNATURE_HEADER, signatureHeader } from "../tools/signature.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import type { AgentGateway } from "./agent-gateway.ts";
import { agentOutputs, lastActionIds, type AgentSessionState } from "./agent-session.ts";
import { AgentTaskResult, type AgentTask } from "./task.ts";
import { sessionWaits } from "../telemetry/waits.ts";

/** The agent webhook settings (`agent` in the config). */
export interface AgentWebhookConfig {
  /** Where tasks are POSTed. */
  url: string | null;
  /** Milliseconds from the task to the session's deadline. */
  timeout_ms: number;
  /** HMAC secret tasks are signed with (`x-edgeloop-signature`); null: unsigned. */
  secret: string | null;
  /** Cap of the webhook's answer in bytes (default 4 MiB); redirects are never followed. */
  max_reply_bytes?: number;
  /** The mask of an abandoned turn's tokens (config `agent.abandoned_mask`): `zero` (default) or `keep`. */
  abandoned_mask?: "zero" | "keep";
}

/**
 * What `openai_agent` needs from its process: the gateway holding the
 * sessions, the URL agents reach this deployment at, and the webhook.
 */
export interface AgentGatewayLink {
  gateway: AgentGateway;
  /** Base URL of the edgeloop API as agents reach it (`http://host:port`), or null when unknown yet. */
  publicUrl(): string | null;
  agent: AgentWebhookConfig;
  /** fetch for the task POST (default the global one). */
  fetch?: typeof fetch;
}

// The loop base defines the context; the loops that need more of their process extend it here, where that
// service is defined (TypeScript module augmentation), so the base never imports a loop of a higher layer.
declare module "../agent-loop/agent-loop.ts" {
  interface AgentLoopContext {
    /** The agent gateway of this process (sessions, public URL, agent webhook): what `openai_agent` runs with. */
    agentGateway?: AgentGatewayLink;
  }
}

/** The agent did not finish by its deadline and called the model not once: the trajectory fails with this. */
export class AgentTimeoutError extends EdgeloopError {
  override name = "AgentTimeoutError";
  constructor(message: string) {
    super(message, { status: 504, code: "agent_timeout" });
  }
}

/** The agent finished without calling the model once: nothing to record, the trajectory fails with this. */
export class AgentNoCallError extends EdgeloopError {
  override name = "AgentNoCallError";
  constructor(message: string) {
    super(message, { status: 422, code: "agent_no_call" });
  }
}

/** The agent webhook refused the task or could not be reached. */
export class AgentWebhookError extends EdgeloopError {
  override name = "AgentWebhookError";
  constructor(message: string) {
    super(message, { status: 502, code: "agent_webhook" });
  }
}

/**
 * `openai_agent`: the trajectory is run by an agent outside edgeloop, any
 * program with an OpenAI client. For each trajectory the loop
 * 1. creates (or, resumed, finds) the agent session of its key — bearer
 *    token, deadline `now + agent.timeout_ms`, the batch's sampling and
 *    budgets — in the gateway;
 * 2. POSTs the signed task ({@link AgentTask}) to `agent.url` unless the
 *    session records it as accepted (at-least-once: after a crash between
 *    the agent's answer and that record it is sent again; agents dedupe on
 *    `key`); a `200` answer with a body is the agent's finish;
 * 3. waits until the session is finished (`POST …/finish`, the task's
 *    answer) or its deadline passes (then it closes with the tokens so far
 *    and `extra_fields.error: "agent_timeout"`; with no call at all the
 *    trajectory fails with {@link AgentTimeoutError});
 * 4. returns one output per output of the session (step-wise outputs, in
 *    order), every one scored with the agent's reward or, without one, the
 *    configured reward of the last assistant turn's text (as `tool_agent`).
 * The loop runs whole inside a durable session: resumed after a crash it
 * finds its agent session (stored apart, under `agent:{key}`) and waits on.
 */
export class OpenAIAgentLoop extends AgentLoop {
  async run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput[]> {
    const link = this.ctx.agentGateway;
    if (!link) throw new ConfigError("rollout.agent", "openai_agent runs only where the agent gateway is served (edgeloop serve, or rollout with --agent)");
    if (!link.agent.url) throw new ConfigError("agent.url", "openai_agent needs agent.url (--agent URL; EDGELOOP_AGENT_URL on Workers): where each trajectory's task is POSTed");
    const base = link.publicUrl();
    if (!base) throw new ConfigError("agent.public_url", "openai_agent needs the URL agents reach edgeloop at (agent.public_url, --public-url; EDGELOOP_PUBLIC_URL on Workers)");
    const gw = link.gateway;
    const key = this.key(kwargs);
    const messages = this.messages(kwargs);
    const wall = this.ctx.asyncTools?.wallClockMs ?? (() => Date.now());
    const now = wall();
    let st = await gw.create({
      v: 1,
      key,
      uid: kwargs.uid,
      session_id: kwargs.session_id,
      token: newToken(),
      created_ms: now,
      deadline_ms: now + link.agent.timeout_ms,
      sampling_params: samplingParams,
      rollout: this.ctx.config,
      tools: this.ctx.tools ? [...this.ctx.tools.schemas] : [],
      messages,
      model_version: null,
      ...this.agentRole(kwargs),
    });
    // Until the session is finished, it waits on the agent (its calls, then its finish): what a stall warning names.
    const waited = sessionWaits.begin({ kind: "agent", name: link.agent.url });
    try {
      if (!st.taskSent && !st.finish) {
        // A resumed session holds its token only as a hash: the task goes out with a new one.
        if (st.token === undefined) st = await gw.rekey(key, newToken());
        await this.sendTask(st, base, link, kwargs, wall);
      }
      st = await gw.waitFinished(key, this.ctx.signal);
    } catch (e) {
      // The trajectory fails: close its session so that the agent's later calls are refused, not answered into nothing.
      await gw.finish(key, { by: "failed", metadata: { error: (e as Error)?.message ?? String(e) } }).catch(() => {});
      throw e;
    } finally {
      waited();
    }
    const fin = st.finish!;
    if (fin.by === "failed") throw new AgentWebhookError(String(fin.metadata?.error ?? "the trajectory failed"));
    if (st.outputs.length === 0) {
      // Nothing to record: the trajectory fails with the reason, never an empty session the trainer cannot see.
      if (fin.by === "timeout") throw new AgentTimeoutError(`agent_timeout: the agent made no call and did not finish within agent.timeout_ms ${link.agent.timeout_ms} ms`);
      const said = fin.metadata && typeof fin.metadata.error === "string" ? `; its metadata.error: ${fin.metadata.error.slice(0, 300)}` : "";
      throw new AgentNoCallError(`agent_no_call: the agent finished (by ${fin.by === "task" ? "the task's answer" : "its finish call"}) without calling the model${said}`);
    }
    let reward = fin.reward;
    let rewardError: string | undefined;
    if (reward === null && st.outputs.length > 0) {
      const ids = lastActionIds(st);
      const r = await this.reward(kwargs, key, ids ? this.ctx.tokenizer.decode(ids, { skipSpecialTokens: true }) : "");
      reward = r.score;
      rewardError = r.error;
    }
    return agentOutputs(st, { reward, metadata: fin.metadata, abandonedMask: link.agent.abandoned_mask, ...(fin.by === "timeout" ? { error: "agent_timeout" } : {}), ...(rewardError ? { rewardError } : {}) });
  }

  /**
   * `{agent_role}` of the row to spread into the session's input: the row's
   * `agent_role` (absent or null: none).
   * @throws InputError (`agent_role`) for a value that is no agent role name.
   */
  private agentRole(kwargs: AgentLoopKwargs): { agent_role?: string } {
    const raw = kwargs.agent_role;
    if (raw === undefined || raw === null) return {};
    const r = AgentRoleName.safeParse(raw);
    if (!r.success) throw new InputError("agent_role", `${r.error.issues[0]!.message}, got ${JSON.stringify(raw).slice(0, 100)}`);
    return { agent_role: r.data };
  }

  /** Whether the agent got the task after all (the session has calls or is finished): then it is marked sent. */
  private async agentWorked(key: string, link: AgentGatewayLink): Promise<boolean> {
    const st = await holdWhileStoreDown(() => link.gateway.get(key));
    if (!st || (st.outputs.length === 0 && !st.finish)) return false;
    await link.gateway.markTaskSent(key);
    return true;
  }

  private async sendTask(st: AgentSessionState, base: string, link: AgentGatewayLink, kwargs: AgentLoopKwargs, wall: () => number): Promise<void> {
    const key = st.input.key;
    const root = `${base.replace(/\/+$/, "")}/v1/sessions/${encodeURIComponent(key)}`;
    const task: AgentTask = {
      key,
      uid: st.input.uid,
      session_id: st.input.session_id,
      base_url: `${root}/openai/v1`,
      api_key: st.token!,
      finish_url: `${root}/finish`,
      model: link.gateway.modelNameFor(st.input.agent_role),
      messages: st.input.messages,
      tools: st.input.tools,
      deadline: st.input.deadline_ms,
      ...(st.input.agent_role !== undefined ? { agent_role: st.input.agent_role } : {}),
      row: {
        data_source: kwargs.data_source ?? null,
        reward_model: kwargs.reward_model ?? null,
        extra_info: (kwargs.extra_info as Record<string, unknown> | null | undefined) ?? null,
      },
    };
    const body = JSON.stringify(task);
    const url = link.agent.url!;
    // Messages and records name the webhook without its query string or userinfo (S13).
    const where = `agent webhook ${redactUrl(url)}`;
    let lastError = "";
    for (let attempt = 0; attempt < 3; attempt++) {
      if (attempt > 0) await new Promise((r) => setTimeout(r, 200 * 4 ** (attempt - 1)));
      const left = st.input.deadline_ms - wall();
      if (left <= 0) return;
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (link.agent.secret) headers[SIGNATURE_HEADER] = await signatureHeader(link.agent.secret, body, wall() / 1000);
      let res: { status: number; text: string };
      try {
        res = await outboundRequest(url, {
          headers,
          body,
          timeoutMs: left,
          maxReplyBytes: link.agent.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES,
          what: where,
          ...(link.fetch ? { fetch: link.fetch } : {}),
          ...(this.ctx.signal ? { signal: this.ctx.signal } : {}),
        });
      } catch (e) {
        if (this.ctx.signal?.aborted) throw e;
        // The deadline passed while a synchronous agent held the request: the wait closes the session.
        if (st.input.deadline_ms - wall() <= 0) return;
        lastError = (e as Error).message;
        if (await this.agentWorked(key, link)) return;
        // A redirect (never followed: the task carries the session's api_key) or an over-cap answer is not retried.
        if (e instanceof OutboundHttpError && (e.kind === "redirect" || e.kind === "too_large")) throw new AgentWebhookError(lastError);
        continue;
      }
      const text = res.text;
      if (res.status === 202 || res.status === 200) {
        const result = res.status === 200 ? taskResult(text) : null;
        if (result === "bad") {
          lastError = `${where} answered 200 with a body that is neither empty, {reward?, metadata?} nor another JSON object: ${text.slice(0, 200)}`;
        } else {
          await link.gateway.markTaskSent(key);
          if (result) await holdWhileStoreDown(() => link.gateway.finish(key, { by: "task", reward: result.reward ?? null, metadata: result.metadata ?? null }));
          return;
        }
      } else lastError = `${where} answered ${res.status}: ${text.slice(0, 300)}`;
      // The agent may have run inside the request and only its answer went wrong: what it did counts.
      if (await this.agentWorked(key, link)) return;
      if (res.status === 200 || (res.status < 500 && res.status !== 429)) throw new AgentWebhookError(lastError);
    }
    if (await this.agentWorked(key, link)) return;
    throw new AgentWebhookError(`${lastError} (3 attempts)`);
  }
}

/**
 * The body of a task's `200` answer: `{reward?, metadata?}` (either key
 * present) is the agent's finish; an empty body or another JSON object (an
 * acknowledgement such as `{"accepted": true}`) accepts the task like `202`
 * (null); anything else is `bad`.
 */
export function taskResult(text: string): AgentTaskResult | null | "bad" {
  if (text.trim() === "") return null;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return "bad";
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) return "bad";
  if (!("reward" in json) && !("metadata" in json)) return null;
  const r = AgentTaskResult.safeParse(json);
  return r.success ? r.data : "bad";
}

/** A fresh session bearer token: 32 random bytes, hex. */
export function newToken(): string {
  const b = crypto.getRandomValues(new Uint8Array(32));
  let s = "";
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return `elk_${s}`;
}
