import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { requireRedis } from "../helpers/redis.ts";
import { awaitRecords, batchRows, startServices, startWorkerd, workerBindings, type Services, type Workerd } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";

// Tracing on the Cloudflare entry: with OTEL_EXPORTER_OTLP_ENDPOINT among the Worker's variables, the Worker and
// each trajectory's Durable Object export their spans over OTLP/HTTP (JSON, sent with fetch) to a loopback collector;
// context crosses awaits in workerd (AsyncLocalStorage under nodejs_compat), so every engine call nests in its turn.
const redis = await requireRedis();
let s: Services;
let w: Workerd;
const otlp: { path: string; type: string | null; body: string }[] = [];
let collector: ReturnType<typeof Bun.serve>;

beforeAll(async () => {
  if (!redis) return;
  collector = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      otlp.push({ path: new URL(req.url).pathname, type: req.headers.get("content-type"), body: await req.text() });
      return Response.json({});
    },
  });
  s = await startServices("workerd-otel");
  w = await startWorkerd({ ...workerBindings(s), OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${collector.port}`, OTEL_SERVICE_NAME: "edgeloop-workerd-test" });
}, HANG_MS);

afterAll(async () => {
  await w?.stop();
  await s?.stop();
  collector?.stop(true);
});

type Span = { name: string; spanId: string; parentSpanId?: string };
const spans = (): Span[] => otlp.flatMap((r) => (JSON.parse(r.body).resourceSpans ?? []).flatMap((rs: any) => rs.scopeSpans.flatMap((ss: any) => ss.spans)));

describe.skipIf(!redis)("tracing in workerd", () => {
  test("the Durable Objects' loop spans reach the OTLP endpoint, engine and tool calls nested in their turns", async () => {
    const rows = batchRows("wdt").slice(0, 2);
    const res = await w.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    await awaitRecords(s.prefix, ["wdt0", "wdt1"], 2);
    // Each alarm flushes before it ends; allow the last export to land.
    const n = (name: string) => spans().filter((x) => x.name === name).length;
    await waitFor(() => n("reward.compute") >= 4 && n("agent_loop.turn") >= 8, "the batch's spans exported", HANG_MS, 100);
    expect(otlp.every((r) => r.path === "/v1/traces" && r.type === "application/json")).toBe(true);
    const all = spans();
    const count = (n: string) => all.filter((x) => x.name === n).length;
    // 2 rows × n=2 durable sessions, each a tool round then an answer: a session steps turn by turn (one alarm
    // may run several), so each turn is a root span holding its engine call and tool calls; one reward per session.
    expect([count("agent_loop.turn"), count("inference.generate"), count("tool.call"), count("reward.compute")]).toEqual([8, 8, 4, 4]);
    const turns = new Set(all.filter((x) => x.name === "agent_loop.turn").map((x) => x.spanId));
    for (const name of ["inference.generate", "tool.call"]) expect(all.filter((c) => c.name === name && !turns.has(c.parentSpanId ?? "")).length).toBe(0);
    expect(otlp.some((r) => r.body.includes('"stringValue":"edgeloop-workerd-test"'))).toBe(true);
  }, HANG_MS);
});
