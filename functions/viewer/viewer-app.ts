import type { Hono } from "hono";
import { VIEWER_CSS, VIEWER_FAVICON_SVG, VIEWER_HTML, VIEWER_JS } from "./assets.generated.ts";

/**
 * The viewer's Content-Security-Policy: its own script, stylesheet and API
 * only (no inline script or style, no eval, no plugins), never framed
 * (`frame-ancestors 'none'`: no clickjacking), no `<base>` and no form posts
 * elsewhere. A payload that slipped past the page's escaping could neither
 * run inline nor send what it read to another origin. `img-src data:`: the
 * thumbnails of a record's inline images (an image runs no script).
 */
export const VIEWER_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** The headers every viewer asset carries besides its content type. */
export const VIEWER_SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": VIEWER_CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
};

/**
 * Adds the trajectory viewer to an app: `GET /viewer` (the page),
 * `/viewer/viewer.js`, `/viewer/viewer.css` and its icon `/viewer/favicon.svg`
 * (the page links it; `/favicon.ico`, which a browser asks for on pages
 * without a link, such as the API's JSON, answers the same icon). The page is static and needs
 * no auth; it calls the `/v1` API (sending the bearer token the user enters
 * when the API wants one; the page keeps it in `sessionStorage`, this tab
 * only, never in `localStorage`). Every asset is sent with
 * {@link VIEWER_SECURITY_HEADERS} (CSP, nosniff, no framing). Assets are
 * prebuilt into `assets.generated.ts` (see `infra/viewer/build.ts`).
 */
export function mountViewer(app: Hono): void {
  const headers = (type: string) => ({ "content-type": type, "cache-control": "no-cache", ...VIEWER_SECURITY_HEADERS });
  app.get("/viewer", () => new Response(VIEWER_HTML, { headers: headers("text/html; charset=utf-8") }));
  app.get("/viewer/", () => new Response(VIEWER_HTML, { headers: headers("text/html; charset=utf-8") }));
  app.get("/viewer/viewer.js", () => new Response(VIEWER_JS, { headers: headers("text/javascript; charset=utf-8") }));
  app.get("/viewer/viewer.css", () => new Response(VIEWER_CSS, { headers: headers("text/css; charset=utf-8") }));
  app.get("/viewer/favicon.svg", () => new Response(VIEWER_FAVICON_SVG, { headers: headers("image/svg+xml") }));
  app.get("/favicon.ico", () => new Response(VIEWER_FAVICON_SVG, { headers: headers("image/svg+xml") }));
}
