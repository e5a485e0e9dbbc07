import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { VIEWER_FAVICON_SVG, VIEWER_HTML, VIEWER_JS } from "../../functions/viewer/assets.generated.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";

// S11 (security audit): the viewer is sent with a Content-Security-Policy (own script, style and API
// only), nosniff and no framing, and the page keeps the API token in this tab's sessionStorage, never
// in localStorage. Every API reply says nosniff too.

let runtime: Runtime;
let app: ReturnType<typeof createRolloutsApp>;
beforeAll(async () => {
  runtime = await buildRuntime({ n: 1, seed: 3 });
  app = createRolloutsApp({ service: runtime.service, apiToken: "viewer-token" });
});
afterAll(() => runtime.close());

const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

describe("S11: viewer headers", () => {
  test("page, script and stylesheet: CSP with frame-ancestors 'none', nosniff, X-Frame-Options DENY, no referrer", async () => {
    for (const [path, type] of [
      ["/viewer", "text/html; charset=utf-8"],
      ["/viewer/", "text/html; charset=utf-8"],
      ["/viewer/viewer.js", "text/javascript; charset=utf-8"],
      ["/viewer/viewer.css", "text/css; charset=utf-8"],
      ["/viewer/favicon.svg", "image/svg+xml"],
      ["/favicon.ico", "image/svg+xml"],
    ] as const) {
      const res = await app.request(path);
      expect([path, res.status, Object.fromEntries(res.headers)]).toEqual([
        path,
        200,
        { "cache-control": "no-cache", "content-type": type, "content-security-policy": CSP, "x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer" },
      ]);
    }
  });

  test("the page works under that CSP: no inline script, style or handler; one same-origin module script and stylesheet", () => {
    expect(VIEWER_HTML).not.toMatch(/<style|\son[a-z]+=|style=|javascript:/i);
    expect([...VIEWER_HTML.matchAll(/<script\b[^>]*>/g)].map((m) => m[0])).toEqual(['<script type="module" src="/viewer/viewer.js">']);
    expect([...VIEWER_HTML.matchAll(/<link\b[^>]*>/g)].map((m) => m[0])).toEqual(['<link rel="icon" href="/viewer/favicon.svg" type="image/svg+xml">', '<link rel="stylesheet" href="/viewer/viewer.css">']);
    // The icon is a plain SVG image: no script, no handler, no external reference (img-src 'self' loads it).
    expect(VIEWER_FAVICON_SVG).toStartWith('<svg xmlns="http://www.w3.org/2000/svg"');
    expect(VIEWER_FAVICON_SVG).not.toMatch(/<script|\son[a-z]+=|href=|url\(/i);
    expect(VIEWER_JS).not.toMatch(/\beval\(|new Function\(|innerHTML/);
  });

  test("the token lives in sessionStorage; localStorage is only read to move an old token out, then cleared", () => {
    expect(VIEWER_JS).not.toContain("localStorage.setItem");
    expect(VIEWER_JS).toContain("sessionStorage.setItem");
    expect(VIEWER_JS).toContain("localStorage.removeItem");
  });

  test("API replies, errors included, carry nosniff", async () => {
    for (const [path, headers, status] of [
      ["/v1/rollouts", {}, 401],
      ["/v1/rollouts", { authorization: "Bearer viewer-token" }, 200],
      ["/v1/nothing", { authorization: "Bearer viewer-token" }, 404],
      ["/openapi.json", {}, 200],
      ["/metrics", {}, 200],
    ] as const) {
      const res = await app.request(path, { headers });
      expect([path, res.status, res.headers.get("x-content-type-options")]).toEqual([path, status, "nosniff"]);
    }
  });
});
