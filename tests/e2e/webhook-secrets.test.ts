import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { setupTelemetry, type Telemetry } from "../../infra/telemetry/setup.ts";
import { answering, closedPort, redirecting } from "../helpers/hostile-servers.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 S13: webhook URLs carrying secrets in their query string (and userinfo) — a tool, a
// simulated user, a reward — fail in every way they can, and the secret reaches no record field
// (the stored record JSON is grepped), no log line, no metric and no span attribute or event.
const ROOT = join(import.meta.dir, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-secrets-"));
const row0 = JSON.parse(readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0]!);
const logs: string[] = [];
const restore: (() => void)[] = [];
let exporter: InMemorySpanExporter;
let telemetry: Telemetry;
let rt: Runtime | undefined;
let rt2: Runtime | undefined;
const servers: { stop: () => void }[] = [];

beforeAll(() => {
  exporter = new InMemorySpanExporter();
  telemetry = setupTelemetry({ exporter, simple: true });
  // Every line the process writes, whatever writes it.
  for (const k of ["log", "error", "warn", "info", "debug"] as const) {
    const orig = console[k];
    console[k] = (...a: unknown[]) => void logs.push(a.map(String).join(" "));
    restore.push(() => (console[k] = orig));
  }
  for (const stream of [process.stdout, process.stderr]) {
    const orig = stream.write.bind(stream);
    stream.write = ((chunk: unknown, ...rest: unknown[]) => (logs.push(String(chunk)), (orig as (...a: unknown[]) => boolean)(chunk, ...rest))) as typeof stream.write;
    restore.push(() => (stream.write = orig as typeof stream.write));
  }
});
afterAll(async () => {
  for (const r of restore) r();
  await rt?.close();
  await rt2?.close();
  await telemetry.shutdown();
  for (const s of servers) s.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("tool (500 and 302), simulated user (refused) and reward (500) with ?token=SECRET: the secret is in no record, log, metric or span", async () => {
  const tool500 = answering(500);
  const tool302 = redirecting(302, "http://127.0.0.1:1/internal?token=SECRET");
  const reward500 = answering(500);
  servers.push(tool500, tool302, reward500);
  const q = (base: string, path: string) => `${base.replace("http://", "http://user:SECRET@")}${path}?token=SECRET&sig=SECRET`;
  const example = JSON.parse(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", "1"));
  example.tools[0].url = q(tool500.base, "/tools/calc");
  example.tools[0].max_retries = 0;
  example.tools[1].url = q(tool302.base, "/tools/lookup");
  example.interactions = [{ name: "u", url: q(`http://127.0.0.1:${closedPort()}`, "/i"), timeout_ms: 2000, max_retries: 0 }];
  writeFileSync(join(dir, "tools.json"), JSON.stringify(example));
  writeFileSync(join(dir, "config.json"), JSON.stringify({ reward: { url: q(reward500.base, "/score"), timeout_ms: 2000, max_retries: 0 } }));
  rt = await buildRuntime({ config: join(dir, "config.json"), tools: join(dir, "tools.json"), n: 1 });
  const app = createRolloutsApp({ service: rt.service });
  const rows = [
    { ...row0, reward_model: { style: "webhook", ground_truth: "31" } },
    { ...row0, extra_info: { ...(row0.extra_info ?? {}), interaction_kwargs: { name: "u" } } },
  ];
  const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
  expect(res.status).toBe(202);
  const { batch_id } = (await res.json()) as { batch_id: string };
  const text = await (await app.request(`/v1/rollouts/${batch_id}/trajectories`)).text();
  const recs = text.trim().split("\n").map((l) => JSON.parse(l) as { error: string | null; extra_fields: Record<string, unknown> });
  expect(recs.length).toBe(2);
  // The failures happened and are named, by host and path only.
  const fields = recs.map((r) => [r.extra_fields.reward_error ?? null, r.extra_fields.error ?? null]);
  const scored = fields.find((f) => f[0] !== null)!;
  const talked = fields.find((f) => f[1] !== null)!;
  expect(scored).toEqual([`webhook ${reward500.base}/score: HTTP 500`, null]);
  expect(String(talked[1])).toMatch(/^interaction 'u': webhook http:\/\/127\.0\.0\.1:\d+\/i: connection failed \(/);
  expect(recs.map((r) => r.extra_fields.tool_errors)).toEqual([1, 1]);
  // The observations as text (the viewer's decoded form): the tool error is there, named without its URL.
  const decoded = await Promise.all(recs.map(async (r) => (await app.request(`/v1/trajectories/${encodeURIComponent((r as unknown as { key: string }).key)}?decode=1`)).text()));
  for (const d of decoded) expect(((JSON.parse(d) as { decoded: { response: string[] } }).decoded.response).join("")).toContain("<tool_response>\nError executing tool 'calc': HTTP 500 (1 attempt)\n</tool_response>");
  // Every place a secret could land.
  const metrics = await (await app.request("/metrics")).text();
  const spans = JSON.stringify(exporter.getFinishedSpans().map((s) => ({ name: s.name, attributes: s.attributes, events: s.events, status: s.status })));
  expect(exporter.getFinishedSpans().length).toBeGreaterThan(0);
  const summaries = await (await app.request(`/v1/rollouts/${batch_id}/summaries`)).text();
  for (const [where, body] of [["records", text], ["decoded records", decoded.join("\n")], ["summaries", summaries], ["logs", logs.join("\n")], ["metrics", metrics], ["spans", spans]] as const) {
    expect({ where, leaks: body.includes("SECRET") }).toEqual({ where, leaks: false });
  }
}, HANG_MS);

test("secrets in webhook URL paths (after /hooks/, /webhooks/, or token-like): in no record, log, metric or span", async () => {
  const tool500 = answering(500);
  const tool302 = redirecting(302, "http://127.0.0.1:1/internal");
  const reward500 = answering(500);
  servers.push(tool500, tool302, reward500);
  const example = JSON.parse(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", "1"));
  example.tools[0].url = `${tool500.base}/hooks/PATHSECRETa`;
  example.tools[0].max_retries = 0;
  example.tools[1].url = `${tool302.base}/tools/PATHSECRET0b9c8d7/lookup`;
  example.interactions = [{ name: "u", url: `http://127.0.0.1:${closedPort()}/api/webhooks/42/PATHSECRETc`, timeout_ms: 2000, max_retries: 0 }];
  writeFileSync(join(dir, "tools-path.json"), JSON.stringify(example));
  writeFileSync(join(dir, "config-path.json"), JSON.stringify({ reward: { url: `${reward500.base}/score/token/PATHSECRETd`, timeout_ms: 2000, max_retries: 0 } }));
  const spansBefore = exporter.getFinishedSpans().length;
  const logsBefore = logs.length;
  rt2 = await buildRuntime({ config: join(dir, "config-path.json"), tools: join(dir, "tools-path.json"), n: 1 });
  const app = createRolloutsApp({ service: rt2.service });
  const rows = [
    { ...row0, reward_model: { style: "webhook", ground_truth: "31" } },
    { ...row0, extra_info: { ...(row0.extra_info ?? {}), interaction_kwargs: { name: "u" } } },
  ];
  const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
  expect(res.status).toBe(202);
  const { batch_id } = (await res.json()) as { batch_id: string };
  const text = await (await app.request(`/v1/rollouts/${batch_id}/trajectories`)).text();
  const recs = text.trim().split("\n").map((l) => JSON.parse(l) as { key: string; extra_fields: Record<string, unknown> });
  expect(recs.length).toBe(2);
  const fields = recs.map((r) => [r.extra_fields.reward_error ?? null, r.extra_fields.error ?? null]);
  // The failures are named with the secret segments as ***.
  expect(fields.find((f) => f[0] !== null)).toEqual([`webhook ${reward500.base}/score/token/***: HTTP 500`, null]);
  expect(String(fields.find((f) => f[1] !== null)![1])).toMatch(/^interaction 'u': webhook http:\/\/127\.0\.0\.1:\d+\/api\/webhooks\/\*\*\*\/\*\*\*: connection failed \(/);
  expect(recs.map((r) => r.extra_fields.tool_errors)).toEqual([1, 1]);
  const decoded = await Promise.all(recs.map(async (r) => (await app.request(`/v1/trajectories/${encodeURIComponent(r.key)}?decode=1`)).text()));
  const metrics = await (await app.request("/metrics")).text();
  const newSpans = exporter.getFinishedSpans().slice(spansBefore);
  expect(newSpans.length).toBeGreaterThan(0);
  const spans = JSON.stringify(newSpans.map((s) => ({ name: s.name, attributes: s.attributes, events: s.events, status: s.status })));
  const summaries = await (await app.request(`/v1/rollouts/${batch_id}/summaries`)).text();
  const newLogs = logs.slice(logsBefore).join("\n");
  for (const [where, body] of [["records", text], ["decoded records", decoded.join("\n")], ["summaries", summaries], ["logs", newLogs], ["metrics", metrics], ["spans", spans]] as const) {
    expect({ where, leaks: body.includes("PATHSECRET") }).toEqual({ where, leaks: false });
  }
}, HANG_MS);
