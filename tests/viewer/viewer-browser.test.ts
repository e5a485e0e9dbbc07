import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { CHROMIUM, HAVE_CHROMIUM, launchChromium } from "../helpers/chromium.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { tokenPieces } from "../../shared/telemetry/token-pieces.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { visibleToken } from "../../functions/viewer/client/segments.ts";
import { groupRows, writeGroupScript } from "./group-fixture.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The viewer in a real headless Chromium (Debian's /usr/bin/chromium via playwright-core)
// against `edgeloop serve`'s app over loopback: real runtime, simulated engine, example tools.
// Batches: the example rows (n = 2), one truncated, a group batch (6 prompts × n = 4 samples that
// differ in length, see group-fixture.ts) and 20 newer one-trajectory batches, so that the first
// three are on the batch list's second page.
const ROOT = join(import.meta.dir, "..", "..");
const ARTIFACTS = join(ROOT, "tests", "artifacts");
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
  let groupBatch: string;
  let groupRecords: TrajectoryRecord[];
  const records = new Map<string, TrajectoryRecord>();

  beforeAll(async () => {
    runtime = await buildRuntime({ n: 2, seed: 1, script: writeGroupScript() });
    const app = createRolloutsApp({ service: runtime.service });
    server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
    base = `http://127.0.0.1:${server.port}`;
    const a = runtime.service.submit({ rows: rows.slice(0, 4), global_steps: 1, model_version: "v1", validate: false });
    const b = runtime.service.submit({ rows: rows.slice(0, 1), global_steps: 1, model_version: null, validate: false, config: { rollout: { n: 1, response_length: 48 } } });
    await Promise.all([a.run.run(), b.run.run()]);
    batchId = a.batch_id;
    for (const r of [...a.run.records(), ...b.run.records()]) records.set(r.key, r);
    truncatedKey = b.run.records()[0]!.key;
    const c = runtime.service.submit({ rows: groupRows(6), global_steps: 1, model_version: null, validate: false, config: { rollout: { n: 4 } } });
    await c.run.run();
    groupBatch = c.batch_id;
    groupRecords = [...c.run.records()];
    await Bun.sleep(2);
    for (let i = 0; i < 20; i++) await runtime.service.submit({ rows: groupRows(1, `fill${i}`), global_steps: 1, model_version: null, validate: false, config: { rollout: { n: 1 } } }).run.run();
    browser = await launchChromium();
    page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  }, HANG_MS);

  afterAll(async () => {
    await browser?.close();
    server?.stop(true);
    await runtime?.close();
  });

  const loaded = () => page.waitForSelector('#trajectories[data-loaded="1"]');

  test("the page has an icon: linked, served as SVG and shown under the page's CSP; loading the page answers no request with an error", async () => {
    const failed: string[] = [];
    const onResponse = (res: { status(): number; url(): string }) => void (res.status() >= 400 && failed.push(`${res.status()} ${res.url()}`));
    const violations: string[] = [];
    const onConsole = (m: { text(): string }) => void (/Content Security Policy/i.test(m.text()) && violations.push(m.text()));
    page.on("response", onResponse);
    page.on("console", onConsole);
    try {
      await page.goto(`${base}/viewer`);
      await page.waitForSelector(".batch");
      const icon = await page.$eval('link[rel="icon"]', (l) => (l as HTMLLinkElement).href);
      expect(icon).toBe(`${base}/viewer/favicon.svg`);
      // The icon as an image in the page itself: img-src 'self' lets it load.
      const size = await page.evaluate(
        (src) =>
          new Promise<number[]>((resolve, reject) => {
            const img = new Image();
            img.onload = () => resolve([img.naturalWidth, img.naturalHeight]);
            img.onerror = () => reject(new Error(`icon did not load: ${src}`));
            img.src = src;
          }),
        icon,
      );
      expect(size[0]).toBeGreaterThan(0);
      const res = await page.request.get(`${base}/favicon.ico`);
      expect([res.status(), res.headers()["content-type"]]).toEqual([200, "image/svg+xml"]);
      expect(failed).toEqual([]);
      expect(violations).toEqual([]);
    } finally {
      page.off("response", onResponse);
      page.off("console", onConsole);
    }
  });

  test("lists batches page by page (older ones after the newest 20) and trajectories; filters by status, truncated and reward on the server", async () => {
    await page.goto(`${base}/viewer`);
    await page.waitForSelector(".batch");
    expect(await page.locator(".batch").count()).toBe(20);
    expect(await page.locator(`.batch[data-batch="${batchId}"]`).count()).toBe(0);
    await page.click("#more-batches");
    await page.waitForSelector(`.batch[data-batch="${batchId}"]`);
    expect(await page.locator(".batch").count()).toBe(23);
    expect(await page.locator("#more-batches").count()).toBe(0);
    await page.click(`.batch[data-batch="${batchId}"]`);
    await loaded();
    expect(await page.locator("tr[data-key]").count()).toBe(8);
    // Whole keys: each cell holds its full key, nothing clipped (the session index of a group's samples shows),
    // with the `_{session_id}_{output_index}` tail set apart.
    const keyCells = await page.$$eval("tr[data-key] td.key", (els) =>
      els.map((e) => ({ key: (e.closest("tr") as HTMLElement).dataset.key, text: e.textContent, tail: e.querySelector(".key-tail")?.textContent, clipped: e.scrollWidth > e.clientWidth })),
    );
    const inBatch = [...records.values()].filter((r) => r.uid !== records.get(truncatedKey)!.uid);
    expect(keyCells.map((c) => [c.text, c.tail, c.clipped])).toEqual(keyCells.map((c) => [c.key, c.key!.slice(c.key!.indexOf("_")), false]));
    expect(keyCells.map((c) => c.key).sort()).toEqual(inBatch.map((r) => r.key).sort());
    await page.selectOption("#f-status", "failed");
    await loaded();
    expect(await page.locator("tr[data-key]").count()).toBe(0);
    await page.selectOption("#f-status", "ok");
    await loaded();
    await page.selectOption("#f-truncated", "no");
    await loaded();
    expect(await page.locator("tr[data-key]").count()).toBe(8);
    await page.fill("#f-rmin", "0.5");
    await loaded();
    const inA = [...records.values()].filter((r) => !r.key.startsWith(truncatedKey.split("_")[0]!));
    const rewarded = inA.filter((r) => r.reward_score !== null && r.reward_score >= 0.5);
    expect(rewarded.length).toBeGreaterThan(0);
    expect(rewarded.length).toBeLessThan(8);
    expect(await page.locator("tr[data-key]").count()).toBe(rewarded.length);
    expect(await page.textContent("#list-count")).toBe(`${rewarded.length} shown · ${rewarded.length} match · 8 in the batch`);
    await page.fill("#f-rmin", "");
    await loaded();
    await page.selectOption("#f-truncated", "");
    await loaded();
    await page.selectOption("#f-status", "");
    await loaded();
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
    // The row's ground truth beside the reward (the record carries it as extra_fields.ground_truth), and at the response's end.
    const promptText = tok.decode(rec.prompt_ids);
    const truth = rows.slice(0, 4).find((row) => promptText.includes(row.prompt[1].content))?.reward_model.ground_truth;
    expect(typeof truth).toBe("string");
    expect(rec.extra_fields.ground_truth).toBe(truth);
    expect(await page.$$eval(".summary dt", (els) => els.map((e) => e.textContent).slice(0, 4))).toEqual(["key", "agent", "reward", "ground_truth"]);
    expect(await page.textContent('dd[data-field="ground_truth"]')).toBe(truth);
    expect(await page.textContent("#reward-mark")).toBe(`reward ${rec.reward_score} · ground truth ${truth}`);
    expect(await page.locator("#truncation").count()).toBe(0);

    await page.hover("#response .tok.s >> nth=3");
    const info = await page.textContent("#hover-info");
    expect(info).toContain(`#3  id ${rec.response_ids[3]}`);
    expect(info).toContain(`log-prob ${rec.rollout_log_probs![3]!.toFixed(4)}`);

    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "viewer-trajectory.png"), fullPage: false });
    expect(existsSync(join(ARTIFACTS, "viewer-trajectory.png"))).toBe(true);
  });

  test("a group batch: the list is paged from the server; the group view shows the n samples side by side, where each diverges, tokens aligned; screenshot", async () => {
    await page.click(`.batch[data-batch="${groupBatch}"]`);
    await loaded();
    expect(await page.locator("tr[data-key]").count()).toBe(24);
    await page.selectOption("#f-limit", "10");
    await loaded();
    const keys = () => page.$$eval("tr[data-key]", (els) => els.map((e) => (e as HTMLElement).dataset.key));
    expect(await keys()).toEqual(groupRecords.slice(0, 10).map((r) => r.key));
    expect(await page.textContent("#list-count")).toBe("10 shown · 24 match · 24 in the batch");
    await page.click("#more-trajectories");
    await page.waitForSelector('tr[data-key]:nth-child(20)');
    await loaded();
    await page.click("#more-trajectories");
    await page.waitForSelector('tr[data-key]:nth-child(24)');
    await loaded();
    expect(await keys()).toEqual(groupRecords.map((r) => r.key));
    expect(await page.locator("#more-trajectories").count()).toBe(0);

    await page.click('tr[data-key="grp-2_0_0"] .group-open');
    await page.waitForSelector("#group-tokens");
    const recs = groupRecords.filter((r) => r.uid === "grp-2").sort((a, b) => a.session_id - b.session_id);
    const cells = (field: string) => page.$$eval(`#group-summary td[data-field="${field}"]`, (els) => els.map((e) => e.textContent));
    expect(await cells("key")).toEqual(["grp-2_0_0", "grp-2_1_0", "grp-2_2_0", "grp-2_3_0"]);
    expect(await cells("reward")).toEqual(recs.map((r) => String(r.reward_score)));
    expect(await cells("reward")).toEqual(["1", "1", "1", "1"]);
    expect(await cells("ground_truth")).toEqual(["4", "4", "4", "4"]);
    expect(await cells("length")).toEqual(["29 tokens (29 sampled · 0 obs)", "6 tokens (6 sampled · 0 obs)", "4 tokens (4 sampled · 0 obs)", "9 tokens (9 sampled · 0 obs)"]);
    expect(await cells("turns")).toEqual(recs.map((r) => String(r.num_turns)));
    expect(await cells("finish")).toEqual(["ok · stop", "ok · stop", "ok · stop", "ok · stop"]);
    // Positions in prompt ‖ response (the prompt is 20 tokens), as tests/rollout/group-divergence.test.ts computes them.
    expect(recs.map((r) => r.prompt_ids.length)).toEqual([20, 20, 20, 20]);
    expect(await cells("diverges")).toEqual([
      "#28 (response #8) · leaves grp-2_3_0",
      "#25 (response #5) · leaves grp-2_0_0",
      "#23 (response #3) · leaves grp-2_0_0",
      "#28 (response #8) · leaves grp-2_0_0",
    ]);
    const tok = await defaultTokenizer();
    const pieces = recs.map((r) => tokenPieces(tok, [...r.prompt_ids, ...r.response_ids]));
    expect(await page.$$eval("#group-summary td[data-field=context] mark", (els) => els.map((e) => e.textContent))).toEqual(["####", "<|im_end|>", "<|im_end|>", "<|im_end|>"]);
    expect([pieces[0]![28], pieces[1]![25], pieces[2]![23], pieces[3]![28]]).toEqual(["####", "<|im_end|>", "<|im_end|>", "<|im_end|>"]);
    // The aligned view: from 6 tokens before the first divergence (23) to the longest sample's end, one row per position.
    const rows = await page.$$eval("#group-tokens tbody tr", (els) => els.map((e) => Number((e as HTMLElement).dataset.pos)));
    expect(rows).toEqual(Array.from({ length: 49 - 17 }, (_, i) => 17 + i));
    const grid = await page.$$eval("#group-tokens td[data-sample]", (els) =>
      els.map((e) => ({ s: Number((e as HTMLElement).dataset.sample), p: Number((e as HTMLElement).dataset.pos), id: (e as HTMLElement).dataset.id, cls: e.className, text: e.textContent })),
    );
    for (const c of grid) {
      const r = recs[c.s]!;
      const ids = [...r.prompt_ids, ...r.response_ids];
      if (c.p >= ids.length) expect([c.cls, c.id]).toEqual(["gone", undefined]);
      else expect([Number(c.id), c.text]).toEqual([ids[c.p]!, visibleToken(pieces[c.s]![c.p]!)]);
    }
    expect(grid.filter((c) => c.cls.includes("div")).map((c) => [c.s, c.p])).toEqual([
      [2, 23],
      [1, 25],
      [0, 28],
      [3, 28],
    ]);
    const differs = await page.$$eval("#group-tokens tr.differs", (els) => els.map((e) => Number((e as HTMLElement).dataset.pos)));
    expect(differs[0]).toBe(23);
    expect(await page.textContent("#group-common")).toContain("all 4 share the first 23 tokens (prompt 20)");
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "viewer-group.png"), fullPage: false });
    expect(existsSync(join(ARTIFACTS, "viewer-group.png"))).toBe(true);

    // A column's header opens that sample; its page leads back to the group.
    await page.click('#group-tokens th[data-sample="1"] a');
    await page.waitForSelector("#response .tok");
    expect(await page.textContent('dd[data-field="key"]')).toBe("grp-2_1_0");
    expect(await page.locator("#response .tok").count()).toBe(6);
    await page.click("#open-group");
    await page.waitForSelector("#group-tokens");
    expect(await page.$$eval('#group-summary td[data-field="key"]', (els) => els.map((e) => e.textContent))).toEqual(["grp-2_0_0", "grp-2_1_0", "grp-2_2_0", "grp-2_3_0"]);

    // The group is reachable by its URL too.
    await page.goto(`${base}/viewer#batch=${groupBatch}&group=grp-1`);
    await page.waitForSelector("#group-tokens");
    expect(await page.$$eval('#group-summary td[data-field="diverges"]', (els) => els.map((e) => e.textContent))).toEqual([
      "#22 (response #2) · leaves grp-1_2_0 (with 1_0, equal to it)",
      "#22 (response #2) · leaves grp-1_2_0 (with 0_0, equal to it)",
      "#32 (response #12) · leaves grp-1_3_0",
      "#32 (response #12) · leaves grp-1_2_0",
    ]);
    expect(await page.$$eval('#group-summary td[data-field="reward"]', (els) => els.map((e) => e.textContent))).toEqual(["0", "0", "1", "1"]);
  });

  test("a running batch: the list grows as trajectories finish, read from the server after its last page", async () => {
    // Its own runtime with a slow simulated engine (150 ms per token: the 8 samples end 0.5–6 s in).
    const cfg = join(mkdtempSync(join(tmpdir(), "edgeloop-viewer-live-")), "config.json");
    writeFileSync(cfg, JSON.stringify({ engine: { sim_latency: { decode_ms_per_token: 150 } } }));
    const live = await buildRuntime({ n: 4, seed: 1, script: writeGroupScript(), config: cfg });
    const liveServer = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createRolloutsApp({ service: live.service }).fetch });
    try {
      const run = live.service.submit({ rows: groupRows(2, "live"), global_steps: 1, model_version: null, validate: false });
      await page.goto(`http://127.0.0.1:${liveServer.port}/viewer#batch=${run.batch_id}`);
      await loaded();
      const first = await page.locator("tr[data-key]").count();
      expect(first).toBeLessThan(8);
      await run.run.run();
      await page.waitForFunction(() => document.querySelectorAll("tr[data-key]").length === 8, undefined, { timeout: 10_000 });
      expect(await page.$$eval("tr[data-key]", (els) => els.map((e) => (e as HTMLElement).dataset.key))).toEqual(run.run.records().map((r) => r.key));
      expect(await page.textContent("#list-count")).toBe("8 shown · 8 match · 8 in the batch");
      expect(await page.locator("#more-trajectories").count()).toBe(0);
    } finally {
      liveServer.stop(true);
      await live.close();
    }
  }, HANG_MS);

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
