import { expect, test } from "bun:test";
import { createGatewayApp } from "../../functions/gateway.ts";
import { freePort } from "../helpers/redis-server.ts";

// An idle gateway's GET /health (a readiness probe) must not report replicas healthy on probes older than the
// health-check period: it runs the probes first. Before, probes ran only on proxied traffic, so a gateway
// whose replicas were all down answered {"status":"ok","healthy":N} forever when idle.
test("GET /health on an idle gateway probes stale replicas first: dead replicas make it 503", async () => {
  const dead = [`http://127.0.0.1:${await freePort()}`, `http://127.0.0.1:${await freePort()}`];
  const gw = createGatewayApp({ replicas: dead, healthIntervalMs: 100 });
  // Fresh: nothing probed yet, replicas assumed healthy until a probe says otherwise.
  let res = await gw.fetch(new Request("http://gw/health"));
  expect([res.status, await res.json()]).toEqual([200, { status: "ok", healthy: 2, replicas: 2 }]);
  await Bun.sleep(150);
  res = await gw.fetch(new Request("http://gw/health"));
  expect([res.status, await res.json()]).toEqual([503, { status: "unavailable", healthy: 0, replicas: 2 }]);
  // With probes only on demand (0), /health does not probe.
  const lazy = createGatewayApp({ replicas: dead, healthIntervalMs: 0 });
  await Bun.sleep(150);
  res = await lazy.fetch(new Request("http://gw/health"));
  expect(res.status).toBe(200);
});
