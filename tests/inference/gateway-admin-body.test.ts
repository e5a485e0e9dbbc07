import { describe, expect, test } from "bun:test";
import { createGatewayApp } from "../../functions/gateway.ts";

// POST/DELETE /admin/replicas: application/json bodies of {url} only, malformed JSON said as such,
// and adding a replica that is already there is a 409 that changes nothing.

const ADMIN = "admin-token";
const auth = { authorization: `Bearer ${ADMIN}` };
const json = { ...auth, "content-type": "application/json" };
const invalid = (field: string, message: string) => ({ error: { code: "invalid_input", message: `${field}: ${message}`, field } });

function gateway() {
  return createGatewayApp({ replicas: ["http://r1.test"], healthIntervalMs: 0, adminToken: ADMIN, fetch: async () => Response.json({}) });
}

async function call(gw: ReturnType<typeof gateway>, method: string, body: string, headers: Record<string, string> = json) {
  const res = await gw.app.request("/admin/replicas", { method, headers, body });
  return [res.status, await res.json()];
}

describe("/admin/replicas bodies", () => {
  test("no content type or text/plain is a 415; an extra key a 400; malformed JSON is reported as such; nothing changes", async () => {
    const gw = gateway();
    const add = JSON.stringify({ url: "http://r2.test" });
    for (const method of ["POST", "DELETE"]) {
      expect(await call(gw, method, add, auth)).toEqual([415, invalid("content-type", "expected application/json, got none")]);
      expect(await call(gw, method, add, { ...auth, "content-type": "text/plain" })).toEqual([415, invalid("content-type", "expected application/json, got 'text/plain'")]);
      expect(await call(gw, method, JSON.stringify({ url: "http://r2.test", weight: 2 }))).toEqual([400, invalid("weight", 'Unrecognized key: "weight"')]);
      expect(await call(gw, method, '{"url": "http://r2.test"')).toEqual([400, invalid("body", "malformed JSON")]);
      expect(await call(gw, method, "")).toEqual([400, invalid("body", "expected a JSON body")]);
      expect(await call(gw, method, JSON.stringify({ url: "ftp://r2.test" }))).toEqual([400, invalid("url", "expected an http(s) URL")]);
      expect(await call(gw, method, "{}")).toEqual([400, invalid("url", "expected an http(s) URL")]);
    }
    expect(gw.replicas().map((r) => r.url)).toEqual(["http://r1.test"]);
  });

  test("adding a replica already present is a 409 naming url (normalised), the replica's state untouched; after a DELETE it adds again", async () => {
    const gw = gateway();
    expect(await call(gw, "POST", JSON.stringify({ url: "http://r2.test" }))).toEqual([201, { replicas: gw.replicas() }]);
    expect(gw.replicas().map((r) => r.url)).toEqual(["http://r1.test", "http://r2.test"]);
    gw.pool.setHealthy("http://r2.test", false);
    for (const url of ["http://r2.test", "http://r2.test/"]) {
      expect(await call(gw, "POST", JSON.stringify({ url }))).toEqual([409, { error: { code: "conflict", message: "replica http://r2.test is already present", field: "url" } }]);
    }
    // The 409 did not restore the replica (as adding an existing one used to).
    expect(gw.replicas().map((r) => [r.url, r.state])).toEqual([
      ["http://r1.test", "healthy"],
      ["http://r2.test", "unhealthy"],
    ]);
    expect((await call(gw, "DELETE", JSON.stringify({ url: "http://r2.test" })))[0]).toBe(200);
    expect(await call(gw, "DELETE", JSON.stringify({ url: "http://r2.test" }))).toEqual([404, { error: { code: "not_found", message: "no replica http://r2.test" } }]);
    expect((await call(gw, "POST", JSON.stringify({ url: "http://r2.test" })))[0]).toBe(201);
    expect(gw.replicas().map((r) => [r.url, r.state])).toEqual([
      ["http://r1.test", "healthy"],
      ["http://r2.test", "healthy"],
    ]);
  });
});
