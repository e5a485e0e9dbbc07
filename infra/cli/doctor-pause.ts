import type { ReplicaControlResult } from "../../shared/inference/engine-control.ts";
import { joinUrl } from "../../shared/inference/engine-http.ts";
import type { DoctorProbe } from "./doctor-probe.ts";
import { prometheusSum } from "./doctor-replies.ts";

// `edgeloop doctor --admin`: the pause/resume check (only while no request runs at any target).

/**
 * `--admin`: with no request running at any target (vLLM `vllm:num_requests_running`
 * and `_waiting` on `GET /metrics`; SGLang `GET /get_load`, else `sglang:num_running_reqs`
 * and `sglang:num_queue_reqs` on `/metrics`), one pause (`abort`, cache kept) and resume through
 * edgeloop's `EngineControl`, vLLM's `/is_paused` read after each, then one call served.
 */
export async function checkPauseResume(d: DoctorProbe, control: ReturnType<DoctorProbe["control"]>, before: ReplicaControlResult[] | null, served: boolean): Promise<void> {
  const fail = (r: ReplicaControlResult | { url: string; status: number; error?: string }, path: string) => controlFailure(d, r.url, path, r.status, r.error);
  for (const r of before ?? []) if (!r.ok) return fail(r, "/is_paused");
  const busy: string[] = [];
  const unknown: string[] = [];
  for (const t of control.targets) {
    const n = await running(d, t.url);
    if (typeof n === "number") {
      if (n > 0) busy.push(`${n} at ${t.url}`);
    } else unknown.push(`${t.url}: ${n.unknown}`);
  }
  if (busy.length > 0) return d.set("pause/resume", "skipped", `requests are running or waiting (${busy.join(", ")}): a pause would abort them; run doctor --admin while the engine is idle`);
  if (unknown.length > 0 && !d.o.force) {
    return d.set("pause/resume", "skipped", `cannot tell whether requests are running (${unknown.join("; ")}): add --force to pause and resume anyway (requests running there would end as aborts)`);
  }
  const failed = (what: string) => {
    for (const t of control.targets) {
      const l = control.failed.get(t.url);
      if (l) return controlFailure(d, t.url, l.path, l.status);
    }
    return d.set("pause/resume", "mismatch", what);
  };
  control.failed.clear();
  try {
    await control.engine.pause({ mode: "abort", clear_cache: false });
  } catch (e) {
    return failed(`the pause failed: ${(e as Error).message}`);
  }
  const during = d.vllm ? (await control.engine.status()).replicas : [];
  let resumeError: string | null = null;
  control.failed.clear();
  try {
    await control.engine.resume();
  } catch (e) {
    resumeError = (e as Error).message;
  }
  if (resumeError) return failed(`the resume failed: ${resumeError}; the engine may still be paused: POST /resume (vLLM) or /continue_generation (SGLang) by hand`);
  const after = d.vllm ? (await control.engine.status()).replicas : [];
  const notPaused = during.filter((r) => r.paused !== true).map((r) => r.url);
  if (notPaused.length > 0) return d.set("pause/resume", "mismatch", `POST /pause answered, but GET /is_paused did not say true at ${notPaused.join(", ")}`);
  const stillPaused = after.filter((r) => r.paused !== false).map((r) => r.url);
  if (stillPaused.length > 0) return d.set("pause/resume", "mismatch", `POST /resume answered, but GET /is_paused did not say false at ${stillPaused.join(", ")}: resume it by hand`);
  const n = control.targets.length > 1 ? ` at ${control.targets.length} replicas (engine.admin_urls)` : "";
  // A generate call that failed before the pause (see generate) fails after it too: that is not the pause's fault.
  if (!served) {
    return d.set("pause/resume", "warn", `POST /pause?mode=abort and /resume answered${n}; GET /is_paused said true, then false; no call was tried after (the generate call fails, see generate)`);
  }
  const { client } = d.client();
  try {
    await client.generate(d.request({ maxTokens: 1 }));
  } catch (e) {
    return d.set("pause/resume", "mismatch", `after the resume a call failed: ${d.reason(e)}`);
  }
  d.set(
    "pause/resume",
    "ok",
    d.vllm
      ? `POST /pause?mode=abort and /resume answered${n}; GET /is_paused said true, then false; a call was served after`
      : `POST /pause_generation {"mode":"abort"} and /continue_generation {} answered${n}; a call was served after (SGLang has no is_paused to read back)`,
  );
}

/** The `pause/resume` line of a control call answered `status` (404: the route is missing; 401/403: which key to set). */
function controlFailure(d: DoctorProbe, url: string, path: string, status: number, error?: string): void {
  const where = d.o.config.engine.admin_urls ? ` at ${url}` : "";
  // Without engine.admin_urls the control calls went to engine.url: edgeloop's gateway there forwards none of them.
  if (status === 404 && d.viaGateway && !d.o.config.engine.admin_urls) {
    return d.set("pause/resume", "missing", `${path} is HTTP 404 from edgeloop's gateway at ${url}, which forwards no engine control: set engine.admin_urls to the replicas' own URLs (doctor and POST /v1/engine/pause reach each one there)`);
  }
  if (status === 404 && d.vllm) return d.set("pause/resume", "missing", `${path} is HTTP 404${where}: start vLLM with VLLM_SERVER_DEV_MODE=1 (it mounts /pause, /resume and /is_paused)`);
  if (status === 404) return d.set("pause/resume", "missing", `${path} is HTTP 404${where}: this SGLang has no pause API (POST /pause_generation, /continue_generation): use a newer SGLang`);
  if ((status === 401 || status === 403) && d.vllm) {
    // vLLM's own --api-key guards only its API routes (/v1, /v2, /inference, …): a refusal of /pause or /is_paused comes from something in front of it.
    if (d.controlKey) {
      const which = d.o.config.engine.admin_api_key ? "engine.admin_api_key" : "engine.api_key";
      return d.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}: the key sent there (${which}) was refused; vLLM's --api-key does not guard its control routes, so a proxy in front wants another key: set engine.admin_api_key to it, or engine.admin_urls to the engines' own URLs`);
    }
    return d.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: a key is wanted there (vLLM's --api-key does not guard its control routes: a proxy in front?): set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)`);
  }
  if (status === 401 || status === 403) {
    const admin = d.o.config.engine.admin_api_key;
    if (!d.vllm && !admin) return d.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: the control routes want SGLang's --admin-api-key: set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)`);
    if (admin) return d.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}: the server refused engine.admin_api_key: set it to the server's --admin-api-key`);
    return d.set("pause/resume", "missing", `${path} is HTTP ${status}${where}: the server wants an API key: set EDGELOOP_ENGINE_API_KEY (or --engine-api-key, engine.api_key) to its --api-key`);
  }
  d.set("pause/resume", "mismatch", `${path} is HTTP ${status}${where}${error ? `: ${error}` : ""}`);
}

/** Requests running or waiting at a replica, or why doctor cannot tell. */
async function running(d: DoctorProbe, url: string): Promise<number | { unknown: string }> {
  if (!d.vllm) {
    const r = await d.call(joinUrl(url, "/get_load"), "GET");
    if (!("error" in r) && r.status >= 200 && r.status < 300) {
      const list = Array.isArray(r.body) ? r.body : [r.body];
      const counts = list.map((x) => (x as { num_reqs?: unknown } | null)?.num_reqs);
      if (counts.length > 0 && counts.every((c) => typeof c === "number" && Number.isFinite(c))) return (counts as number[]).reduce((a, b) => a + b, 0);
    }
  }
  const names = d.vllm ? ["vllm:num_requests_running", "vllm:num_requests_waiting"] : ["sglang:num_running_reqs", "sglang:num_queue_reqs"];
  const m = await d.call(joinUrl(url, "/metrics"), "GET");
  if ("error" in m) return { unknown: `GET /metrics: ${m.error}` };
  if (m.status < 200 || m.status >= 300) return { unknown: `GET /metrics is HTTP ${m.status}${d.vllm ? "" : " and /get_load gives no num_reqs"}` };
  const n = prometheusSum(m.text, names);
  return n ?? { unknown: `GET /metrics has no ${names[0]}${d.vllm ? "" : " (start SGLang with --enable-metrics)"}` };
}
