import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { privateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Error bodies say what went wrong and where: a uid registered with another n or partition names
// rows[i].uid; an oversized body is request_too_large; a store outage is store_unreachable naming the store.
const runtimes: Runtime[] = [];
const cleanups: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close().catch(() => undefined);
  for (const c of cleanups) await c();
});

type App = ReturnType<typeof createRolloutsApp>;
const post = (app: App, body: unknown) => app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
const row = (uid: string) => ({ uid, data_source: "edge", prompt: [{ role: "user", content: `What is 2+2? (${uid})` }], reward_model: { style: "rule", ground_truth: "4" } });

async function memoryApp(): Promise<App> {
  const rt = await buildRuntime({ n: 1, seed: 3 });
  runtimes.push(rt);
  return createRolloutsApp({ service: rt.service });
}

describe("409 for a uid registered with another n or partition names the row", () => {
  test("another n: rows[1].uid", async () => {
    const app = await memoryApp();
    expect((await post(app, { rows: [row("n1")], config: { rollout: { n: 2 } } })).status).toBe(202);
    const res = await post(app, { rows: [row("fresh-a"), row("n1")], config: { rollout: { n: 3 } } });
    expect(res.status).toBe(409);
    expect(await res.json()).toEqual({
      error: {
        code: "conflict",
        message: "rows[1].uid: group n1 is registered with n=2 in train, not n=3 in train: a uid names one group; use a new uid for new samples",
        field: "rows[1].uid",
      },
    });
  });
  test("another partition: rows[2].uid", async () => {
    const app = await memoryApp();
    expect((await post(app, { rows: [row("p1")] })).status).toBe(202);
    const res = await post(app, { rows: [row("fresh-b"), row("fresh-c"), row("p1")], validate: true });
    expect(res.status).toBe(409);
    expect(await res.json()).toEqual({
      error: {
        code: "conflict",
        message: "rows[2].uid: group p1 is registered with n=1 in train, not n=1 in val: a uid names one group; use a new uid for new samples",
        field: "rows[2].uid",
      },
    });
  });
});

test("a body over the default 32 MiB is 413 request_too_large", async () => {
  const app = await memoryApp();
  const chunk = new Uint8Array(1024 * 1024).fill(0x20);
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (let i = 0; i < 32; i++) c.enqueue(chunk);
      c.enqueue(new Uint8Array([0x20]));
      c.close();
    },
  });
  const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body });
  expect(res.status).toBe(413);
  expect(await res.json()).toEqual({ error: { code: "request_too_large", message: "body: larger than 33554432 bytes", field: "body" } });
});

test("POST /v1/rollouts while the Redis store is down: 503 store_unreachable naming the store, as /health does", async () => {
  const redis = await privateRedis();
  cleanups.push(() => redis.dispose());
  await redis.start();
  const rt = await buildRuntime({ n: 1, seed: 3, store: redis.url, storePrefix: `eb-${crypto.randomUUID().slice(0, 8)}` });
  runtimes.push(rt);
  const app = createRolloutsApp({ service: rt.service, health: rt.storeHealth });
  await redis.stop();
  const res = await post(app, { rows: [row("down1")] });
  expect(res.status).toBe(503);
  expect(res.headers.get("retry-after")).toBe("1");
  const body = (await res.json()) as { error: { code: string; message: string } };
  expect(body.error.code).toBe("store_unreachable");
  expect(body.error.message).toStartWith(`store ${redis.url} unreachable: `);
  const health = await app.request("/health");
  expect(health.status).toBe(503);
  expect(((await health.json()) as { error: { code: string } }).error.code).toBe("store_unreachable");
}, HANG_MS);
