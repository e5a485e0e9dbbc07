import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";

// The viewer in a real headless Chromium (Debian's /usr/bin/chromium via playwright-core)
// against `edgeloop serve`'s app over loopback: real runtime, simulated engine, example tools.
const ROOT = join(import.meta.dir, "..", "..");
const ARTIFACTS = join(ROOT, "tests", "artifacts");
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const HAVE_CHROMIUM = existsSync(CHROMIUM);
const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l));

if (!HAVE_CHROMIUM && process.env.CI) {
  test("chromium is installed (.ci/run installs it with apt)", () => {
    throw new Error(`no chromium at ${CHROMIUM}: apt-get install -y chromium`);
  });
}

describe.skipIf(!HAVE_CHROMIUM)("viewer in headless chromium", () => {
  let runtime: Runtime;
  let server: ReturnType<typeof Bun.serve>;
  let browser: Browser;
  let page: Page;
  let base: string;
  let batchId: string;
  let truncatedKey: string;
  const records = new Map<string, TrajectoryRecord>();

  beforeAll(async () => {
    runtime = await buildRuntime({ n: 2, seed: 1 });
    const app = createRolloutsApp({ service: runtime.service });
    server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
    base = `http://127.0.0.1:${server.port}`;
    const a = runtime.service.submit({ rows: rows.slice(0, 4), global_steps: 1, model_version: "v1", validate: false });
    const b = runtime.service.submit({ rows: rows.slice(0, 1), global_steps: 1, model_version: null, validate: false, config: { rollout: { n: 1, response_length: 48 } } });
    await Promise.all([a.run.run(), b.run.run()]);
    batchId = a.batch_id;
    for (const r of [...a.run.records(), ...b.run.records()]) records.set(r.key, r);
    truncatedKey = b.run.records()[0]!.key;
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
    });
    page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  }, 30_000);

  afterAll(async () => {
    await browser?.close();
    server?.stop(true);
    await runtime?.close();
  });

  test("lists batches and trajectories; filters by status, truncated and reward", async () => {
    await page.goto(`${base}/viewer`);
    await page.click(`.batch[data-batch="${batchId}"]`);
    await page.waitForSelector('#trajectories[data-loaded="1"]');
    expect(await page.locator(".batch").count()).toBe(2);
    expect(await page.locator("tr[data-key]").count()).toBe(8);
    await page.selectOption("#f-status", "failed");
    expect(await page.locator("tr[data-key]").count()).toBe(0);
    await page.selectOption("#f-status", "ok");
    await page.selectOption("#f-truncated", "no");
    expect(await page.locator("tr[data-key]").count()).toBe(8);
    await page.fill("#f-rmin", "0.5");
    const rewarded = [...records.values()].filter((r) => r.key.length && r.reward_score !== null && r.reward_score >= 0.5 && !r.key.startsWith(truncatedKey.split("_")[0]!));
    expect(await page.locator("tr[data-key]").count()).toBe(rewarded.length);
    await page.fill("#f-rmin", "");
    await page.selectOption("#f-truncated", "");
    await page.selectOption("#f-status", "");
  });

  test("one trajectory: every response token is a span coloured by its mask; turns, tool call, reward; screenshot", async () => {
    const rec = [...records.values()].find((r) => r.num_turns === 4 && !r.truncated)!;
    await page.click(`tr[data-key="${rec.key}"]`);
    await page.waitForSelector("#response .tok");
    const spans = await page.$$eval("#response .tok", (els) =>
      els.map((e) => ({ cls: e.className, mask: (e as HTMLElement).dataset.mask, id: (e as HTMLElement).dataset.id, text: e.textContent, bg: getComputedStyle(e).backgroundColor })),
    );
    expect(spans.length).toBe(rec.response_ids.length);
    expect(spans.map((s) => (/\bs\b/.test(s.cls) ? 1 : /\bo\b/.test(s.cls) ? 0 : -1))).toEqual(rec.response_mask);
    expect(spans.map((s) => Number(s.mask))).toEqual(rec.response_mask);
    expect(spans.map((s) => Number(s.id))).toEqual(rec.response_ids);
    const tok = await defaultTokenizer();
    expect(spans.map((s) => s.text).join("")).toBe(tok.decode(rec.response_ids));
    // Two colours, one per mask value.
    const bg = (m: number) => new Set(spans.filter((s) => Number(s.mask) === m).map((s) => s.bg));
    expect([...bg(1)]).toEqual(["rgb(200, 240, 200)"]);
    expect([...bg(0)]).toEqual(["rgb(207, 224, 255)"]);

    expect(await page.$$eval(".turn-mark", (els) => els.map((e) => e.textContent))).toEqual(["assistant turn 1", "tool result 1", "assistant turn 2"]);
    // The policy version label at the start of each token_versions segment (here one: the batch's).
    expect(rec.extra_fields.token_versions).toEqual([[0, "v1"]]);
    expect(await page.$$eval("#response .ver-mark", (els) => els.map((e) => [e.textContent, (e as HTMLElement).dataset.start, (e.nextElementSibling as HTMLElement).dataset.i]))).toEqual([["v1", "0", "0"]]);
    expect(await page.textContent('dd[data-field="versions"]')).toBe("v1 from #0");
    const call = await page.$$eval("#response .tok.call", (els) => els.map((e) => e.textContent).join(""));
    expect(call).toContain('<tool_call>\n{"name": "calc"');
    expect(call.endsWith("</tool_call>")).toBe(true);
    expect(await page.textContent('dd[data-field="reward"]')).toBe(String(rec.reward_score));
    expect(await page.locator("#truncation").count()).toBe(0);

    await page.hover("#response .tok.s >> nth=3");
    const info = await page.textContent("#hover-info");
    expect(info).toContain(`#3  id ${rec.response_ids[3]}`);
    expect(info).toContain(`log-prob ${rec.rollout_log_probs![3]!.toFixed(4)}`);

    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "viewer-trajectory.png"), fullPage: false });
    expect(existsSync(join(ARTIFACTS, "viewer-trajectory.png"))).toBe(true);
  });

  test("a truncated trajectory opened by key shows the truncation point", async () => {
    const rec = records.get(truncatedKey)!;
    expect(rec.truncated).toBe(true);
    await page.goto(`${base}/viewer#key=${truncatedKey}`);
    await page.waitForSelector("#truncation");
    expect(await page.locator("#response .tok").count()).toBe(rec.response_ids.length);
    expect(await page.textContent("#truncation")).toContain(`after ${rec.response_ids.length} response tokens`);
    await page.screenshot({ path: join(ARTIFACTS, "viewer-truncated.png") });
  });
});
