import { z } from "zod";
import { EnginePauseRequest } from "../shared/inference/engine-control.ts";
import { RolloutRequest } from "../shared/rollout/batch.ts";
import { TrajectoryRecord } from "../shared/schema/index.ts";
import { ToolResultCallback } from "../shared/session/tool-result-callback.ts";
import { agentGatewayOpenApiPaths } from "./agent-gateway-openapi.ts";
import { AckRequest, ConsumedVersionRequest, EngineResumeRequest, GroupRecordsQuery, GroupsQuery, ModelVersionRequest, SummariesQuery, TrajectoryQuery } from "./rollouts-schemas.ts";

/** OpenAPI query parameters of a query schema (an object of string fields), each with its JSON schema. */
function queryParameters(q: z.ZodObject): Record<string, unknown>[] {
  const doc = z.toJSONSchema(q, { io: "input", unrepresentable: "any" }) as { properties?: Record<string, unknown> };
  return Object.entries(doc.properties ?? {}).map(([name, schema]) => ({ name, in: "query", required: false, schema }));
}

/** The OpenAPI 3.1 document, generated from the zod schemas of the boundary. */
export function openApiDocument(): Record<string, unknown> {
  const schema = (s: z.ZodType) => z.toJSONSchema(s, { io: "input", unrepresentable: "any" });
  const json = (s: z.ZodType) => ({ content: { "application/json": { schema: schema(s) } } });
  const err = { description: "error", content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } } };
  return {
    openapi: "3.1.0",
    info: { title: "edgeloop", version: "0.1.0", description: "Agent-loop rollouts for agentic RL: POST a batch, read token trajectories." },
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" }, session_bearer: { type: "http", scheme: "bearer", description: "an agent session's own token (the task's api_key)" } },
      schemas: {
        TrajectoryRecord: schema(TrajectoryRecord),
        Error: {
          type: "object",
          properties: { error: { type: "object", properties: { code: { type: "string" }, message: { type: "string" }, field: { type: "string" } } } },
        },
      },
    },
    security: [{ bearer: [] }],
    paths: {
      "/v1/rollouts": {
        get: {
          summary: "Batches newest first, paged (queue mode: every batch stored in Redis; inline: this process's)",
          parameters: ["limit", "cursor"].map((name) => ({ name, in: "query", required: false, schema: { type: "string" } })),
          responses: { "200": { description: "{batches: BatchSummary[], next_cursor: string | null}" }, "400": err },
        },
        post: { summary: "Submit a batch of dataset rows", requestBody: json(RolloutRequest), responses: {
            "202": { description: "accepted: {batch_id, keys, reused_uids, complete_uids} (uids whose group already existed resume it; complete ones are returned as they are)" },
            "400": err,
            "401": err,
            "409": err,
            "413": { ...err, description: "request_too_large: the body is over 32 MiB, or a row cannot fit in one store request (names rows[i]); nothing was written" },
            "415": err,
            "503": { ...err, description: "queue_full (more jobs than --max-pending would wait) or the store refuses writes; Retry-After says when to try again", headers: { "Retry-After": { schema: { type: "integer" } } } },
          },
        },
      },
      "/v1/queue": {
        get: { summary: "Job-queue depth, in-flight jobs and the oldest job's age (the autoscaler's signal)", responses: { "200": { description: "{mode, depth, in_flight, stranded?, oldest_age_ms, workers?}: depth = jobs a worker can claim now (waiting, plus stranded: held past the lease by a worker that stopped heart-beating)" } } },
      },
      "/v1/sandboxes": {
        get: { summary: "Sandbox leases (a tools file with a `sandbox` lifecycle): the store's live set and counters, this process's counters", responses: { "200": { description: "{enabled: false} without a sandbox lifecycle; else {enabled: true, spec: {create_url, ttl_s, lifetime_s, max_creates_per_s, create_burst, max_live}, store: {live, creating, releasing, tokens, counters}, process: {creates, create_failures, released, release_failures, lost}}" }, "503": err } },
      },
      "/v1/model-version": {
        get: { summary: "The current policy version", responses: { "200": { description: "{version, seq}" } } },
        post: { summary: "Set the policy version (after a weight update)", requestBody: json(ModelVersionRequest), responses: { "200": { description: "{version, seq}" }, "400": err } },
      },
      "/v1/consumed-version": {
        get: { summary: "The newest policy version whose groups the trainer reported consuming", responses: { "200": { description: "{version, seq} ({version: null, seq: 0} before any report)" } } },
        post: { summary: "Report consumption (admission control: rollout.max_staleness holds new trajectories while model-version seq − consumed seq exceeds it)", requestBody: json(ConsumedVersionRequest), responses: { "200": { description: "{version, seq}" }, "400": err } },
      },
      "/v1/engine/pause": {
        post: { summary: "Pause every engine replica (abort: in-flight requests end and are resumed after; wait: drain first; keep: frozen) and hold new engine calls", requestBody: json(EnginePauseRequest), responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "400": err, "401": err, "502": err } },
      },
      "/v1/engine/resume": { post: { summary: "Resume every engine replica and let engine calls go (no body, or {})", requestBody: { required: false, ...json(EngineResumeRequest) }, responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "400": err, "401": err, "415": err, "502": err } } },
      "/v1/engine/status": { get: { summary: "Pause state, engine calls in flight, each replica's is_paused", responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "401": err } } },
      "/v1/rollouts/{batch_id}": {
        get: { summary: "Batch progress and metrics", responses: { "200": { description: "BatchStats" }, "404": err } },
        delete: { summary: "Cancel the batch: queued trajectories removed, running ones aborted, nothing more stored, incomplete groups withdrawn", responses: { "200": { description: "BatchStats with cancelled {at, sessions, groups_withdrawn, groups_complete}" }, "404": err, "409": err, "501": err } },
      },
      "/v1/trajectories/{key}": {
        get: {
          summary: "One stored trajectory; decode=1 adds the text of every token",
          parameters: [{ name: "key", in: "path", required: true, schema: { type: "string" } }, ...queryParameters(TrajectoryQuery)],
          responses: { "200": { description: "TrajectoryRecord (plus decoded: {prompt, response} per-token strings)" }, "400": { ...err, description: "a bad key, an unknown query parameter or a decode other than 0/1/true/false (field names it)" }, "404": err, "409": { ...err, description: "decode=1 on a record of another model (its model.fingerprint differs from this server's tokenizer), code model_mismatch" } },
        },
      },
      "/v1/rollouts/{batch_id}/trajectories": {
        get: { summary: "NDJSON stream of TrajectoryRecords as they finish", responses: { "200": { description: "application/x-ndjson" }, "404": err } },
      },
      "/v1/rollouts/{batch_id}/summaries": {
        get: {
          summary: "One page of the batch's trajectories as summaries (no token arrays), in completion order, filtered",
          parameters: [
            { name: "batch_id", in: "path", required: true, schema: { type: "string" } },
            ...queryParameters(SummariesQuery),
          ],
          responses: {
            "200": { description: "{summaries: [{key, uid, session_id, output_index, status, reward_score, num_turns, truncated, finish_reason, prompt_length, response_length, sampled, error}], next_cursor: string | null, total, matched, done} (a running batch: after the last page, cursor=<total> reads what finished since)" },
            "400": { ...err, description: "a query parameter is invalid (field names it)" },
            "401": err,
            "404": err,
          },
        },
      },
      "/v1/rollouts/{batch_id}/groups/{uid}": {
        get: {
          summary: "The records of one prompt group in the batch and where its samples diverge (on prompt ‖ response token ids)",
          parameters: [
            { name: "batch_id", in: "path", required: true, schema: { type: "string" } },
            { name: "uid", in: "path", required: true, schema: { type: "string" } },
            ...queryParameters(GroupRecordsQuery),
          ],
          responses: {
            "200": { description: "{batch_id, uid, records: TrajectoryRecord[] (by session_id; decode=1 adds decoded), divergence: {common_prefix, samples: [{key, at, kind: token|ended|identical, nearest, length}]}}" },
            "400": err,
            "401": err,
            "404": { ...err, description: "unknown batch, or no trajectory of this uid in it" },
          },
        },
      },
      "/v1/groups": {
        get: {
          summary: "Complete groups for a trainer (at-least-once; ack them)",
          parameters: queryParameters(GroupsQuery),
          responses: { "200": { description: "{groups: CompleteGroup[]}" }, "400": err },
        },
      },
      "/v1/groups/{uid}": {
        get: {
          summary: "One prompt group's progress (expected null for a uid never registered)",
          parameters: [{ name: "uid", in: "path", required: true, schema: { type: "string" } }],
          responses: { "200": { description: "{uid, partition, expected, finished, records, failed, complete, fingerprint}" }, "400": err },
        },
      },
      "/v1/groups/ack": { post: { summary: "Acknowledge delivered groups", requestBody: json(AckRequest), responses: { "200": { description: "{acked}" }, "400": err } } },
      "/v1/sessions/{key}/tool-results": {
        post: {
          summary: "An asynchronous tool's result (the tool answered its call 202 Accepted): signed like tool calls, not by the bearer token",
          security: [],
          parameters: [
            { name: "key", in: "path", required: true, schema: { type: "string" } },
            { name: "x-edgeloop-signature", in: "header", required: true, description: "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\"> with tools.secret; refused outside a 5-minute window", schema: { type: "string" } },
          ],
          requestBody: json(ToolResultCallback),
          responses: {
            "200": { description: "{ok: true, key, call_id}" },
            "400": err,
            "401": { ...err, description: "missing, bad or stale x-edgeloop-signature" },
            "403": { ...err, description: "no tools.secret configured: callbacks are never accepted unsigned" },
            "415": { ...err, description: "the body is not sent as application/json (judged after the signature)" },
            "404": { ...err, description: "no session with this key" },
            "409": { ...err, description: "the session waits for no call with this call_id, or it was already answered" },
            "413": { ...err, description: "body over 4 MiB" },
          },
        },
      },
      "/v1/sessions/{key}": {
        get: {
          summary: "A durable session's phase, step and the tool calls it awaits",
          parameters: [{ name: "key", in: "path", required: true, schema: { type: "string" } }],
          responses: { "200": { description: "{phase, step, loop_state, deadline_ms, awaited: [{call_id, name, deadline_ms}]} (phase running | waiting | finished | done | failed)" }, "401": err, "404": err },
        },
      },
      "/metrics": {
        get: {
          summary: "Prometheus text exposition: edgeloop_sessions_total, edgeloop_trajectories_total{outcome}, the agent_loop histograms, this process's tool and engine calls (docs/metrics.md)",
          security: [],
          responses: { "200": { description: "Prometheus text format 0.0.4", content: { "text/plain": { schema: { type: "string" } } } } },
        },
      },
      "/health": {
        get: {
          summary: "Liveness and the store's reachability",
          security: [],
          responses: { "200": { description: "{ok: true, …}" }, "503": { ...err, description: "{ok: false, store, error: {code: store_unreachable, …}} while the store does not answer" } },
        },
      },
      ...agentGatewayOpenApiPaths(err),
    },
  };
}
