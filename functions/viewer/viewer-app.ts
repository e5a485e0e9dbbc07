import type { Hono } from "hono";
import { VIEWER_CSS, VIEWER_HTML, VIEWER_JS } from "./assets.generated.ts";

/**
 * Adds the trajectory viewer to an app: `GET /viewer` (the page),
 * `/viewer/viewer.js` and `/viewer/viewer.css`. The page is static and needs
 * no auth; it calls the `/v1` API (sending the bearer token the user enters
 * when the API wants one). Assets are prebuilt into `assets.generated.ts`
 * (see `infra/viewer/build.ts`).
 */
export function mountViewer(app: Hono): void {
  const headers = (type: string) => ({ "content-type": type, "cache-control": "no-cache" });
  app.get("/viewer", () => new Response(VIEWER_HTML, { headers: headers("text/html; charset=utf-8") }));
  app.get("/viewer/", () => new Response(VIEWER_HTML, { headers: headers("text/html; charset=utf-8") }));
  app.get("/viewer/viewer.js", () => new Response(VIEWER_JS, { headers: headers("text/javascript; charset=utf-8") }));
  app.get("/viewer/viewer.css", () => new Response(VIEWER_CSS, { headers: headers("text/css; charset=utf-8") }));
}
