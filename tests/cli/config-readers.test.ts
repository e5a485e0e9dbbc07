import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { z } from "zod";
import { AppConfig } from "../../shared/config/app-config.ts";

// Configuration honesty (issue 18 item 10): no setting may be accepted and then ignored. Every leaf key of
// AppConfig is listed here with the file that reads it and the code that reads it there; the test walks the
// schema, so a new key fails until its reader is named, and a reader that is removed or renamed fails too.
// (A key the CLI refuses instead — e.g. the worker's rollout flags — needs no entry: it is not a config key.)
const ROOT = join(import.meta.dir, "..", "..");

/** leaf path → [file, code that reads the value there]. */
const READERS: Record<string, [string, string]> = {
  "rollout.n": ["shared/rollout/batch.ts", "const defaultN = req.validate ? rollout.val_kwargs.n : rollout.n;"],
  "rollout.prompt_length": ["shared/rollout/batch.ts", "promptLength: rollout.prompt_length"],
  "rollout.response_length": ["shared/rollout/batch.ts", "responseLength: rollout.response_length"],
  "rollout.max_model_len": ["shared/inference/context-size.ts", "if (config.max_model_len) return"],
  "rollout.calculate_log_probs": ["shared/rollout/executor.ts", "logprobs: rollout.calculate_log_probs"],
  "rollout.return_routed_experts": ["shared/agent-loop/agent-loop.ts", "this.ctx.config?.return_routed_experts === true"],
  "rollout.temperature": ["shared/rollout/executor.ts", "temperature: src.temperature"],
  "rollout.top_p": ["shared/rollout/executor.ts", "top_p: src.top_p"],
  "rollout.top_k": ["shared/rollout/executor.ts", "top_k: src.top_k"],
  "rollout.seed": ["shared/rollout/executor.ts", "rollout.seed === undefined"],
  "rollout.val_kwargs.temperature": ["shared/rollout/executor.ts", "validate ? rollout.val_kwargs : rollout"],
  "rollout.val_kwargs.top_p": ["shared/rollout/executor.ts", "validate ? rollout.val_kwargs : rollout"],
  "rollout.val_kwargs.top_k": ["shared/rollout/executor.ts", "validate ? rollout.val_kwargs : rollout"],
  "rollout.val_kwargs.n": ["shared/rollout/batch.ts", "req.validate ? rollout.val_kwargs.n"],
  "rollout.val_kwargs.do_sample": ["shared/rollout/executor.ts", "validate && !rollout.val_kwargs.do_sample"],
  "rollout.multi_turn.enable": ["shared/agent-loop/tool-agent.ts", "if (!mt.enable && wantsMore)"],
  "rollout.multi_turn.max_assistant_turns": ["shared/agent-loop/tool-agent.ts", "d.assistantTurns >= mt.max_assistant_turns"],
  "rollout.multi_turn.max_user_turns": ["shared/agent-loop/tool-agent.ts", "d.userTurns >= mt.max_user_turns"],
  "rollout.multi_turn.max_parallel_calls": ["shared/agent-loop/tool-agent.ts", "attempts.slice(0, mt.max_parallel_calls)"],
  "rollout.multi_turn.max_tool_response_length": ["shared/agent-loop/tool-agent.ts", "mt.max_tool_response_length, mt.tool_response_truncate_side"],
  "rollout.multi_turn.tool_response_truncate_side": ["shared/agent-loop/tool-agent.ts", "mt.max_tool_response_length, mt.tool_response_truncate_side"],
  "rollout.multi_turn.format": ["shared/agent-loop/tool-agent.ts", "createToolCallParser(ctx.config.multi_turn.format"],
  "rollout.multi_turn.execute_calls_on_length": ["shared/agent-loop/tool-agent.ts", "!mt.execute_calls_on_length"],
  "rollout.agent.default_agent_loop": ["shared/jobs/job-worker.ts", "t.row?.agent_name ?? spec.rollout.agent.default_agent_loop"],
  "rollout.agent.agent_loop_config_path": ["infra/cli/builders/loops.ts", "const loopsPath = config.rollout.agent.agent_loop_config_path;"],
  "rollout.image_truncation": ["shared/agent-loop/tool-agent.ts", "imageTruncation: config.image_truncation"],
  "rollout.chat_template_kwargs": ["shared/agent-loop/tool-agent.ts", "sharedObservationEncoder(this.ctx.tokenizer, d.tools?.schemas, this.ctx.config.chat_template_kwargs)"],
  "rollout.max_staleness": ["shared/rollout/executor.ts", "waitForAdmission(deps.policy, rollout.max_staleness"],
  "rollout.staleness_policy": ["shared/rollout/executor.ts", 'rollout.staleness_policy !== "admit"'],
  "rollout.oversample": ["shared/rollout/batch.ts", "Math.ceil(rows / rollout.oversample!)"],
  "rollout.trajectory_deadline_s": ["shared/agent-loop/trajectory-deadline.ts", "const s = rollout.trajectory_deadline_s;"],
  "rollout.partial_rollout": ["shared/rollout/batch.ts", "partial_rollout: rollout.partial_rollout"],
  "rollout.teacher.url": ["infra/cli/teacher.ts", 'cfg.url === "sim"'],
  "rollout.teacher.urls": ["infra/cli/teacher.ts", "replicas: cfg.urls"],
  "rollout.teacher.format": ["infra/cli/teacher.ts", "format: cfg.format"],
  "rollout.teacher.model": ["infra/cli/teacher.ts", "model: cfg.model"],
  "rollout.teacher.timeout_ms": ["infra/cli/teacher.ts", "timeoutMs: cfg.timeout_ms"],
  "rollout.teacher.on_error": ["shared/rollout/teacher-scoring.ts", 'cfg.on_error === "fail"'],
  // Each has one allowed value: the group filter (`rollout.filter_groups` set) is what reads them.
  "rollout.filter_groups.metric": ["shared/rollout/batch.ts", "const filter = rollout.filter_groups;"],
  "rollout.filter_groups.drop_if": ["shared/rollout/batch.ts", "const filter = rollout.filter_groups;"],
  "engine.url": ["infra/cli/builders/engine.ts", 'if (e.url !== "sim") {'],
  "engine.format": ["infra/cli/builders/engine.ts", "format: e.format"],
  "engine.script": ["infra/cli/builders/engine.ts", "const scriptPath = e.script ?? DEFAULT_SCRIPT;"],
  "engine.replicas": ["infra/cli/builders/engine.ts", "if (e.replicas === 1) {"],
  "engine.model": ["infra/cli/builders/engine.ts", "model: e.model ?? undefined"],
  "engine.timeout_ms": ["infra/cli/builders/engine.ts", "timeoutMs: e.timeout_ms"],
  "engine.max_retries": ["infra/cli/builders/engine.ts", "retry: { retries: e.max_retries }"],
  "engine.max_reply_bytes": ["infra/cli/builders/engine.ts", "maxReplyBytes: e.max_reply_bytes"],
  "engine.sim_kv_cache_blocks": ["infra/cli/builders/engine.ts", "kvCacheBlocks: e.sim_kv_cache_blocks"],
  "engine.admin_urls": ["infra/cli/builders/engine.ts", "(e.admin_urls ?? [e.url])"],
  "engine.api_key": ["infra/cli/builders/engine.ts", "apiKey: e.api_key"],
  "engine.pools": ["infra/cli/builders/engine.ts", "Object.entries(config.engine.pools ?? {})"],
  "limits.max_outputs_per_session": ["shared/agent-loop/session-limits.ts", "maxOutputs: l.max_outputs_per_session"],
  "limits.max_engine_calls_per_session": ["shared/agent-loop/session-limits.ts", "maxEngineCalls: l.max_engine_calls_per_session"],
  "openenv.base_url": ["shared/agent-loop/openenv-agent.ts", "const url = await this.baseUrl(d, s, fresh);"],
  "openenv.transport": ["shared/agent-loop/openenv-agent.ts", "transport: s.transport,"],
  "openenv.timeout_ms": ["shared/agent-loop/openenv-agent.ts", "timeoutMs: s.timeout_ms,"],
  "openenv.max_message_bytes": ["shared/agent-loop/openenv-agent.ts", "maxBytes: s.max_message_bytes,"],
  "openenv.reset_kwargs": ["shared/agent-loop/openenv-agent.ts", "...s.reset_kwargs };"],
  "openenv.reward": ["shared/agent-loop/openenv-agent.ts", "} else if (s.reward === \"last\")"],
  "openenv.action.format": ["shared/agent-loop/openenv-agent.ts", "if (a.format === \"text\") action ="],
  "openenv.action.field": ["shared/agent-loop/openenv-agent.ts", "[a.field ?? \"message\"]"],
  "openenv.action.on_invalid": ["shared/agent-loop/openenv-agent.ts", "if (a.on_invalid === \"end\")"],
  "openenv.action.tools": ["shared/agent-loop/openenv-agent.ts", "a.tools.length ? { tools: a.tools } : {}"],
  "openenv.observation.field": ["shared/agent-loop/openenv-agent.ts", "text = observationText(res.observation, s.observation.field);"],
  "openenv.observation.reset": ["shared/agent-loop/openenv-agent.ts", "const mode = s.observation.reset;"],
  "openenv.observation.reset_field": ["shared/agent-loop/openenv-agent.ts", "s.observation.reset_field ?? s.observation.field"],
  "openenv.observation.role": ["shared/agent-loop/openenv-agent.ts", "s.observation.role === \"tool\""],
  "limits.reward_min": ["shared/agent-loop/session-limits.ts", "rewardMin: l.reward_min"],
  "limits.reward_max": ["shared/agent-loop/session-limits.ts", "rewardMax: l.reward_max"],
  "limits.max_prompt_length": ["shared/config/app-config.ts", "if (c.rollout.prompt_length > c.limits.max_prompt_length) {"],
  "limits.max_response_length": ["shared/config/app-config.ts", "if (c.rollout.response_length > c.limits.max_response_length) {"],
  "engine.admin_api_key": ["infra/cli/builders/engine.ts", "const controlKey = e.admin_api_key ?? e.api_key;"],
  "engine.sim_engine_version": ["infra/cli/builders/engine.ts", "engineVersion: e.sim_engine_version ?? \"main\""],
  "engine.sim_latency.prefill_ms_per_token": ["infra/sim-engine/sim-engine.ts", "this.latency.prefill_ms_per_token > 0"],
  "engine.sim_latency.decode_ms_per_token": ["infra/sim-engine/sim-engine.ts", "const decodeMs = this.latency.decode_ms_per_token;"],
  "engine.moe.layers": ["shared/inference/sglang-client.ts", "this.moe = [opts.moe.layers, opts.moe.top_k]"],
  "engine.moe.top_k": ["shared/inference/sglang-client.ts", "this.moe = [opts.moe.layers, opts.moe.top_k]"],
  "engine.moe.num_experts": ["infra/sim-engine/sim-engine.ts", "num_experts: moe.num_experts ??"],
  "tools.file": ["infra/cli/builders/tools.ts", "await readFile(config.tools.file"],
  "tools.secret": ["infra/cli/serve-command.ts", "secret: runtime.config.tools.secret"],
  "store.url": ["infra/cli/builders/store.ts", "const url = config.store.url;"],
  "store.prefix": ["infra/cli/builders/service.ts", "new JobQueue(built.commander, { prefix: config.store.prefix"],
  "store.max_request_bytes": ["infra/cli/builders/store.ts", "{ maxRequestBytes: config.store.max_request_bytes }"],
  "store.shards": ["infra/cli/builders/store.ts", "shards: config.store.shards"],
  "store.durability": ["infra/cli/builders/store.ts", "config.store.durability === \"replicated\" ? { durability:"],
  "store.wait_replicas": ["infra/cli/builders/store.ts", "replicas: config.store.wait_replicas ?? 1, timeoutMs: config.store.wait_timeout_ms ?? 1000"],
  "store.wait_timeout_ms": ["infra/cli/builders/store.ts", "replicas: config.store.wait_replicas ?? 1, timeoutMs: config.store.wait_timeout_ms ?? 1000"],
  "store.blobs.url": ["infra/blobs/open-blob-store.ts", "new BlobOffloadQueue(queue, openBlobStore(b.url)"],
  "store.blobs.threshold_bytes": ["infra/blobs/open-blob-store.ts", "thresholdBytes: b.threshold_bytes"],
  "reward.url": ["infra/cli/builders/service.ts", "config.reward.url ? { webhook: { url: config.reward.url"],
  "reward.timeout_ms": ["infra/cli/builders/service.ts", "timeout_ms: config.reward.timeout_ms"],
  "reward.max_retries": ["infra/cli/builders/service.ts", "max_retries: config.reward.max_retries"],
  "reward.max_reply_bytes": ["infra/cli/builders/service.ts", "max_reply_bytes: config.reward.max_reply_bytes"],
  "gateway.attempt_timeout_ms": ["infra/cli/gateway-options.ts", "attemptTimeoutMs: g.attempt_timeout_ms"],
  "gateway.eject_after": ["infra/cli/gateway-options.ts", "ejectAfter: g.eject_after"],
  "gateway.cooldown_ms": ["infra/cli/gateway-options.ts", "cooldownMs: g.cooldown_ms"],
  "gateway.max_attempts": ["infra/cli/gateway-options.ts", "maxAttempts: g.max_attempts"],
  "gateway.health_interval_ms": ["infra/cli/gateway-options.ts", "healthIntervalMs: g.health_interval_ms"],
  "gateway.epsilon": ["infra/cli/gateway-options.ts", "epsilon: g.epsilon"],
  "gateway.sticky_epsilon": ["infra/cli/gateway-options.ts", "stickyEpsilon: g.sticky_epsilon"],
  "gateway.max_sticky_keys": ["infra/cli/gateway-options.ts", "maxStickyKeys: g.max_sticky_keys"],
  "gateway.shared_state": ["infra/cli/builders/store.ts", "if (url === \"memory\" || !config.gateway.shared_state) return null;"],
  "gateway.lease_ttl_ms": ["infra/cli/builders/store.ts", "leaseTtlMs: config.gateway.lease_ttl_ms"],
  "gateway.pin_ttl_ms": ["infra/cli/builders/store.ts", "pinTtlMs: config.gateway.pin_ttl_ms"],
  "store.retention.records": ["infra/cli/gc-command.ts", "{ records: r.records, groups: r.groups, sessions: r.sessions, batches: r.batches }"],
  "store.retention.groups": ["infra/cli/gc-command.ts", "{ records: r.records, groups: r.groups, sessions: r.sessions, batches: r.batches }"],
  "store.retention.sessions": ["infra/cli/builders/service.ts", "terminalTtlSeconds: config.store.retention.sessions"],
  "store.retention.batches": ["infra/cli/builders/service.ts", "batchTtlSeconds: config.store.retention.batches"],
  "agent.url": ["infra/cli/builders/agent.ts", "agent: { url: config.agent.url"],
  "agent.timeout_ms": ["infra/cli/builders/agent.ts", "timeout_ms: config.agent.timeout_ms"],
  "agent.secret": ["infra/cli/builders/agent.ts", "secret: config.agent.secret"],
  "agent.max_reply_bytes": ["infra/cli/builders/agent.ts", "max_reply_bytes: config.agent.max_reply_bytes"],
  "agent.abandoned_mask": ["infra/cli/builders/agent.ts", "abandoned_mask: config.agent.abandoned_mask"],
  "agent.public_url": ["infra/cli/builders/agent.ts", "let publicUrl: string | null = config.agent.public_url;"],
  "agent.roles": ["infra/cli/builders/agent.ts", "...(config.agent.roles ? { roles: config.agent.roles } : {})"],
  "limits.max_prompt_chars": ["shared/service/rollout-service.ts", "cfg.limits.max_prompt_chars"],
  "limits.max_event_loop_lag_ms": ["shared/service/rollout-service.ts", "opts.config.limits.max_event_loop_lag_ms"],
  max_batch_trajectories: ["shared/service/rollout-service.ts", "planBatch(req, cfg.rollout, cfg.max_batch_trajectories"],
  concurrency: ["infra/cli/worker-command.ts", "concurrency: runtime.config.concurrency"],
  model: ["infra/cli/builders/model.ts", "loadTokenizer(config.model ?? undefined)"],
};

/** The schema under wrappers (default, optional, nullable, pipe). */
function unwrap(s: z.ZodType): z.ZodType {
  let t = s as z.ZodType & { def: { type: string; innerType?: z.ZodType; in?: z.ZodType } };
  while (["default", "optional", "nullable", "prefault", "readonly", "pipe"].includes(t.def.type)) t = (t.def.innerType ?? t.def.in) as typeof t;
  return t;
}

/** Every leaf path of an object schema; records and arrays are leaves. */
function leafPaths(s: z.ZodType, prefix = ""): string[] {
  const t = unwrap(s) as z.ZodType & { def: { type: string; shape?: Record<string, z.ZodType> } };
  if (t.def.type !== "object") return [prefix];
  return Object.entries(t.def.shape!).flatMap(([k, v]) => leafPaths(v, prefix ? `${prefix}.${k}` : k));
}

test("every config key has a named reader, and only config keys are listed", () => {
  const leaves = leafPaths(AppConfig).sort();
  expect(Object.keys(READERS).sort()).toEqual(leaves);
});

test("every named reader is in its file (the code that reads the key is still there)", () => {
  const missing: string[] = [];
  const files = new Map<string, string>();
  for (const [key, [file, code]] of Object.entries(READERS)) {
    const text = files.get(file) ?? readFileSync(join(ROOT, file), "utf8");
    files.set(file, text);
    if (!text.includes(code)) missing.push(`${key}: ${file} no longer contains ${JSON.stringify(code)}`);
  }
  expect(missing).toEqual([]);
});
