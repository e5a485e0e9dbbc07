import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { HAVE_CHROMIUM, launchChromium } from "../helpers/chromium.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { imageRuns, thumbnailSrc, type ViewerImage } from "../../functions/viewer/client/segments.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 33 item 5: the viewer shows a vision trajectory's images in place — a thumbnail at each image's
// placeholder run, the pads kept (hidden) so the page still has one span per token — in real headless
// Chromium under the viewer's CSP, for the README's image example (qwen3_vl, examples/images.jsonl).
const ROOT = join(import.meta.dir, "..", "..");
const rows = readFileSync(join(ROOT, "examples", "images.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));

const img = (over: Partial<ViewerImage>): ViewerImage => ({ sha256: "a".repeat(64), mime: "image/png", width: 64, height: 48, data: "iVBORw0KGgo=", span: [10, 14], source: "prompt", field: "prompt[1].content[0].image", ...over });

test("imageRuns and thumbnailSrc: spans by region, malformed ones and non-images left out", () => {
  const images = [img({}), img({ span: [40, 50], source: "tool" }), img({ span: [5, 5] }), img({ span: [3, 200] })];
  expect([...imageRuns(images, 0, 30)]).toEqual([[10, { image: images[0]!, end: 14 }]]);
  expect([...imageRuns(images, 30, 60)]).toEqual([[10, { image: images[1]!, end: 20 }]]);
  expect(thumbnailSrc(img({}))).toBe("data:image/png;base64,iVBORw0KGgo=");
  expect(thumbnailSrc(img({ data: undefined }))).toBeNull();
  expect(thumbnailSrc(img({ mime: "text/html" }))).toBeNull();
  expect(thumbnailSrc(img({ data: '"><script>' }))).toBeNull();
});

describe.skipIf(!HAVE_CHROMIUM)("viewer: images in place (headless chromium)", () => {
  let runtime: Runtime;
  let server: ReturnType<typeof Bun.serve>;
  let browser: Browser;
  let page: Page;
  let base: string;
  let batchId: string;
  let records: TrajectoryRecord[];

  beforeAll(async () => {
    runtime = await buildRuntime({ model: "qwen3_vl", script: join(ROOT, "examples", "policy-images.json"), n: 1, seed: 1 });
    const app = createRolloutsApp({ service: runtime.service, tokenizer: runtime.tokenizer });
    server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
    base = `http://127.0.0.1:${server.port}`;
    const b = runtime.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
    await b.run.run();
    batchId = b.batch_id;
    records = [...b.run.records()];
    browser = await launchChromium();
    page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  }, HANG_MS);
  afterAll(async () => {
    await browser?.close();
    server?.stop(true);
    await runtime?.close();
  });

  test("each image a loaded thumbnail at its span, its pads hidden, one span per token; no CSP violation", async () => {
    const violations: string[] = [];
    page.on("console", (m) => {
      if (/Content Security Policy|Refused to load/i.test(m.text())) violations.push(m.text());
    });
    const withImages = records.filter((r) => (r.multi_modal?.images.length ?? 0) > 0);
    expect(withImages.length).toBe(rows.length);
    await page.goto(`${base}/viewer`);
    await page.click(`.batch[data-batch="${batchId}"]`);
    await page.waitForSelector('#trajectories[data-loaded="1"]');
    for (const rec of withImages) {
      await page.click(`tr[data-key="${rec.key}"]`);
      await page.waitForFunction((key) => document.querySelector('#detail [data-field="key"]')?.textContent === key && document.querySelector("#response .tok") !== null, rec.key).catch(async (e) => {
        throw new Error(`${(e as Error).message}; the detail pane says: ${(await page.textContent("#detail"))?.slice(0, 600)}`);
      });
      const thumbs = await page.$$eval(".thumb", (els) => els.map((e) => ({ tag: e.tagName, span: (e as HTMLElement).dataset.span, at: (e as HTMLElement).dataset.at, loaded: e instanceof HTMLImageElement ? e.complete && e.naturalWidth > 0 : false, w: e instanceof HTMLImageElement ? e.naturalWidth : 0 })));
      expect(thumbs).toEqual(rec.multi_modal!.images.map((i) => ({ tag: "IMG", span: `${i.span[0]},${i.span[1]}`, at: String(i.span[0]), loaded: true, w: i.width })));
      // One span per token still (pads hidden, not removed); the hidden ones are exactly the pads.
      const P = rec.prompt_ids.length;
      const prompt = await page.$$eval(".tokens.prompt .tok", (els) => els.map((e) => [Number((e as HTMLElement).dataset.id), e.classList.contains("pad")]));
      const resp = await page.$$eval("#response .tok", (els) => els.map((e) => [Number((e as HTMLElement).dataset.id), e.classList.contains("pad")]));
      const isPad = (pos: number) => rec.multi_modal!.images.some((i) => pos >= i.span[0] && pos < i.span[1]);
      expect(prompt).toEqual(rec.prompt_ids.map((id, i) => [id, isPad(i)]));
      expect(resp).toEqual(rec.response_ids.map((id, i) => [id, isPad(P + i)]));
      expect([...prompt, ...resp].filter(([, pad]) => pad).every(([id]) => id === 151655)).toBe(true);
      // The thumbnail sits right after <|vision_start|>: its previous sibling is that token.
      const before = await page.$$eval(".thumb", (els) => els.map((e) => Number((e.previousElementSibling as HTMLElement | null)?.dataset.id)));
      expect(before).toEqual(rec.multi_modal!.images.map(() => 151652));
      expect(await page.textContent('[data-field="images"]')).toContain(`${rec.multi_modal!.images.length} (`);
    }
    expect(violations).toEqual([]);
  }, HANG_MS);
});
