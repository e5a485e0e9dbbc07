// The trajectory viewer (browser code, bundled by infra/viewer/build.ts into ../assets.generated.ts).
// It reads the same HTTP API a trainer uses: GET /v1/rollouts (paged), a batch's trajectory summaries
// page by page (GET /v1/rollouts/{id}/summaries), one record with the text of every token on click
// (GET /v1/trajectories/{key}?decode=1: the browser has no tokenizer), and a prompt group's records with
// where its samples diverge (GET /v1/rollouts/{id}/groups/{uid}?decode=1).
import { textAround, type GroupDivergence } from "../../../shared/rollout/group-divergence.ts";
import type { SummaryPage, TrajectorySummary } from "../../../shared/rollout/trajectory-summary.ts";
import { expertsAt, heat, imageRuns, sandboxLine, segments, thumbnailSrc, toolCallTokens, versionStarts, visibleToken, type ViewerImage } from "./segments.ts";

interface Rec {
  key: string;
  uid: string;
  session_id: number;
  output_index: number;
  agent_name: string;
  data_source: string;
  prompt_ids: number[];
  response_ids: number[];
  response_mask: number[];
  rollout_log_probs: number[] | null;
  /** The teacher's log-probs (rollout.teacher), when recorded. */
  teacher_log_probs?: number[];
  reward_score: number | null;
  num_turns: number;
  truncated: boolean;
  finish_reason: string;
  error: string | null;
  metrics: Record<string, number>;
  extra_fields: Record<string, unknown>;
  /** Flat int32 `[P + R, layers, top_k]`, absent unless routed experts were requested. */
  routed_experts?: number[];
  routed_experts_shape?: [number, number];
  decoded?: { prompt: string[]; response: string[] };
  /** A vision family's images with their spans in prompt ‖ response (absent for text-only records). */
  multi_modal?: { images: ViewerImage[] };
}

/**
 * An image in place of its placeholder pads: a thumbnail of its inline bytes (or a box naming it when
 * the record holds only its hash), with its span; the pads stay in the page, hidden (one span per token).
 */
function thumbnail(img: ViewerImage, at: number): HTMLElement {
  const src = thumbnailSrc(img);
  const title = `${img.source} image ${img.width}×${img.height} ${img.mime}, sha256 ${img.sha256.slice(0, 12)}…, tokens [${img.span[0]}, ${img.span[1]}) (${img.span[1] - img.span[0]}), ${img.field}`;
  const attrs = { class: src ? "thumb" : "thumb missing", "data-span": `${img.span[0]},${img.span[1]}`, "data-at": at, title };
  if (!src) return h("span", attrs, `image ${img.width}×${img.height} (${img.span[1] - img.span[0]} tokens; bytes not inline)`);
  const el = h("img", { ...attrs, alt: `image ${img.width}×${img.height}` });
  (el as HTMLImageElement).src = src;
  return el;
}

interface BatchSummary {
  batch_id: string;
  validate: boolean;
  done: boolean;
  /** Sessions (`total`, `finished`, …) and records (`ok`, `failed`, …) counted apart. */
  counts: { total: number; finished: number; records: number; ok: number; failed: number; truncated: number; pending: number; running: number };
  reward: { mean: number | null };
  started_at: number;
}

type Attrs = Record<string, string | number | boolean | undefined>;

function h(tag: string, attrs: Attrs = {}, ...children: (Node | string | null)[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (k === "class") el.className = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null) el.append(c);
  return el;
}

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const fmt = (x: number | null | undefined, d = 3) => (x == null ? "–" : Number.isInteger(x) ? String(x) : x.toFixed(d));
/** The row's ground truth a record carries (`extra_fields.ground_truth`, any JSON value) as text: a string as it is, else its JSON; null when not recorded. */
const groundTruth = (r: Rec): string | null => {
  const gt = r.extra_fields.ground_truth;
  return gt === undefined || gt === null ? null : typeof gt === "string" ? gt : JSON.stringify(gt);
};
/** A trajectory key as a cell: the whole key, its `_{session_id}_{output_index}` tail set apart so that a group's samples are told apart at a glance. */
const keyCell = (key: string, uid: string) =>
  key.startsWith(`${uid}_`) ? h("span", {}, h("span", { class: "key-uid" }, uid), h("span", { class: "key-tail" }, key.slice(uid.length))) : key;

/** Where the API token is kept: this tab's sessionStorage (gone with the tab), never localStorage. */
const TOKEN_KEY = "edgeloop.token";

function token(): string {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

/** A token an older viewer left in localStorage moves to this tab's sessionStorage and leaves localStorage. */
function forgetStoredToken(): void {
  const old = localStorage.getItem(TOKEN_KEY);
  if (old === null) return;
  localStorage.removeItem(TOKEN_KEY);
  if (!sessionStorage.getItem(TOKEN_KEY)) sessionStorage.setItem(TOKEN_KEY, old);
}

async function api(path: string): Promise<Response> {
  const t = token();
  const res = await fetch(path, { headers: t ? { authorization: `Bearer ${t}` } : {} });
  if (res.status === 401) {
    $("auth").hidden = false;
    throw new Error("the API needs a bearer token (EDGELOOP_API_TOKEN): enter it above");
  }
  if (!res.ok) {
    const body = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
    throw new Error(body?.error?.message ?? `HTTP ${res.status}`);
  }
  return res;
}

function showError(where: HTMLElement, e: unknown): void {
  where.replaceChildren(h("p", { class: "error" }, String((e as Error).message ?? e)));
}

// ---- batches -------------------------------------------------------------

/** A row of the trajectory list (`GET /v1/rollouts/{id}/summaries`): no token arrays. */
type Summary = TrajectorySummary;

let summaries: Summary[] = [];
/** The next page's cursor of the trajectory list (null: no more), and the list's counts. */
let listCursor: string | null = null;
let listCounts = { total: 0, matched: 0 };
/** Bumped by every (re)load of the list, so that a page answered after a newer load started is dropped. */
let listEpoch = 0;
/** The next page's cursor of the batch list (null: no older batches). */
let batchCursor: string | null = null;
let currentBatch: string | null = null;
/** The trajectory open in the detail pane (its list row stays marked across list renders). */
let openKey: string | null = null;
/** The hash this page set itself, so that its own hashchange is not routed again. */
let ownHash = "";

function setHash(h: string): void {
  ownHash = h;
  location.hash = h;
}

function batchButton(b: BatchSummary): HTMLElement {
  return h(
    "button",
    { class: `batch${b.batch_id === currentBatch ? " active" : ""}`, "data-batch": b.batch_id, title: b.batch_id },
    h("span", { class: "bid" }, b.batch_id.slice(0, 8)),
    h("span", { class: b.done ? "done" : "running" }, b.done ? "done" : "running"),
    h("span", { title: "records ok / failed · sessions finished / planned" }, `${b.counts.ok}✓ ${b.counts.failed}✗ · ${b.counts.finished}/${b.counts.total}`),
    h("span", {}, `r̄ ${fmt(b.reward.mean, 2)}`),
  );
}

/** Loads the first page of the batch list (`more`: the next, older page, appended). */
async function loadBatches(more = false): Promise<void> {
  const list = $("batches");
  try {
    const q = new URLSearchParams({ limit: "20" });
    if (more && batchCursor) q.set("cursor", batchCursor);
    const page = (await (await api(`/v1/rollouts?${q}`)).json()) as { batches: BatchSummary[]; next_cursor: string | null };
    batchCursor = page.next_cursor;
    if (!more && page.batches.length === 0) {
      list.replaceChildren(h("p", { class: "muted" }, "No batches yet: POST /v1/rollouts."));
      return;
    }
    const buttons = page.batches.map(batchButton);
    if (more) {
      list.querySelector("#more-batches")?.remove();
      list.append(...buttons);
    } else list.replaceChildren(...buttons);
    if (batchCursor) list.append(h("button", { id: "more-batches", class: "more", title: "GET /v1/rollouts?cursor=…" }, "older batches…"));
  } catch (e) {
    showError(list, e);
  }
}

async function openBatch(id: string): Promise<void> {
  currentBatch = id;
  setHash(`batch=${encodeURIComponent(id)}`);
  for (const b of document.querySelectorAll<HTMLElement>(".batch")) b.classList.toggle("active", b.dataset.batch === id);
  void loadSandboxes();
  await loadTrajectories(false);
}

/** The deployment's sandbox leases above the batch's list (GET /v1/sandboxes); hidden without a sandbox lifecycle or on an error. */
async function loadSandboxes(): Promise<void> {
  const line = await api("/v1/sandboxes")
    .then((r) => r.json())
    .then(sandboxLine, () => null);
  const p = $("sandboxes");
  p.hidden = line === null;
  p.textContent = line ?? "";
}

/** The list's query: page size and the filters, as `GET /v1/rollouts/{id}/summaries` takes them. */
function listQuery(): URLSearchParams {
  const q = new URLSearchParams({ limit: ($("f-limit") as HTMLSelectElement).value });
  const status = ($("f-status") as HTMLSelectElement).value;
  const trunc = ($("f-truncated") as HTMLSelectElement).value;
  const rmin = ($("f-rmin") as HTMLInputElement).value.trim();
  const rmax = ($("f-rmax") as HTMLInputElement).value.trim();
  if (status) q.set("status", status);
  if (trunc) q.set("truncated", trunc === "yes" ? "1" : "0");
  if (rmin !== "") q.set("reward_min", rmin);
  if (rmax !== "") q.set("reward_max", rmax);
  return q;
}

/** Loads the first page of the current batch's trajectory list (`more`: the next page, appended). */
async function loadTrajectories(more: boolean): Promise<void> {
  if (currentBatch === null) return;
  const epoch = more ? listEpoch : ++listEpoch;
  const table = $("trajectories");
  delete table.dataset.loaded;
  if (!more) table.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const q = listQuery();
    if (more && listCursor) q.set("cursor", listCursor);
    const page = await summariesPage(currentBatch, q);
    if (epoch !== listEpoch) return;
    summaries = more ? [...summaries, ...page.summaries] : page.summaries;
    listCursor = page.next_cursor;
    listCounts = { total: page.total, matched: page.matched };
    renderTrajectoryList();
    table.dataset.loaded = "1";
    if (listCursor === null && !page.done) follow(epoch, page.total);
  } catch (e) {
    if (epoch === listEpoch) showError(table, e);
  }
}

/** One page of `GET /v1/rollouts/{batch}/summaries` with query `q` (the server's SummaryPage plus `done`). */
async function summariesPage(batch: string, q: URLSearchParams): Promise<SummaryPage & { done: boolean }> {
  return (await (await api(`/v1/rollouts/${encodeURIComponent(batch)}/summaries?${q}`)).json()) as SummaryPage & { done: boolean };
}

/** Milliseconds between reads of a running batch's new records. */
const FOLLOW_MS = 1500;

/**
 * While the batch runs and the whole list is shown, appends the records that
 * finish (read from position `from`, the batch's record count at the last
 * read), until the batch is done or another list is loaded (`epoch`).
 */
function follow(epoch: number, from: number): void {
  setTimeout(async () => {
    if (epoch !== listEpoch || listCursor !== null || currentBatch === null) return;
    try {
      const q = listQuery();
      q.set("cursor", String(from));
      const page = await summariesPage(currentBatch, q);
      if (epoch !== listEpoch || listCursor !== null) return;
      summaries = [...summaries, ...page.summaries];
      listCursor = page.next_cursor;
      listCounts = { total: page.total, matched: page.matched };
      renderTrajectoryList();
      if (listCursor === null && !page.done) follow(epoch, page.total);
    } catch {
      if (epoch === listEpoch) follow(epoch, from);
    }
  }, FOLLOW_MS);
}

function renderTrajectoryList(): void {
  const body = summaries.map((r) =>
    h(
      "tr",
      { "data-key": r.key, class: [r.status === "failed" ? "failed" : r.truncated ? "trunc" : "", r.key === openKey ? "active" : ""].join(" ").trim() },
      h("td", { class: "key", title: r.key }, keyCell(r.key, r.uid)),
      h("td", {}, r.status),
      h("td", { class: "num" }, fmt(r.reward_score, 2)),
      h("td", {}, r.truncated ? "✂" : ""),
      h("td", { class: "num" }, String(r.num_turns)),
      h("td", { class: "num" }, `${r.sampled}/${r.response_length - r.sampled}`),
      h("td", {}, h("button", { class: "group-open", "data-uid": r.uid, title: `compare the samples of ${r.uid}` }, "group")),
    ),
  );
  const parts: Node[] = [
    h("p", { class: "muted", id: "list-count" }, `${summaries.length} shown · ${listCounts.matched} match · ${listCounts.total} in the batch`),
    h(
      "table",
      {},
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ...(
            [
              ["key", "trajectory key {uid}_{session_id}_{output_index}"],
              ["status", "ok or failed"],
              ["reward", "reward_score"],
              ["✂", "truncated"],
              ["turns", "num_turns"],
              ["s/obs", "response tokens sampled (mask 1) / observation (mask 0)"],
              ["", "open the prompt group: its n samples side by side"],
            ] as const
          ).map(([c, title]) => h("th", { title }, c)),
        ),
      ),
      h("tbody", {}, ...body),
    ),
  ];
  if (listCursor) parts.push(h("button", { id: "more-trajectories", class: "more" }, `next ${($("f-limit") as HTMLSelectElement).value}…`));
  $("trajectories").replaceChildren(...parts);
}

// ---- one trajectory ------------------------------------------------------

/** Opens one trajectory; `inBatch`: it belongs to the open batch (listed, or named with it in the URL). */
async function openTrajectory(key: string, inBatch = currentBatch !== null && summaries.some((r) => r.key === key)): Promise<void> {
  setHash(inBatch ? `batch=${encodeURIComponent(currentBatch!)}&key=${encodeURIComponent(key)}` : `key=${encodeURIComponent(key)}`);
  openKey = key;
  for (const tr of document.querySelectorAll<HTMLElement>("tr[data-key]")) tr.classList.toggle("active", tr.dataset.key === key);
  const pane = $("detail");
  pane.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const rec = (await (await api(`/v1/trajectories/${encodeURIComponent(key)}?decode=1`)).json()) as Rec;
    renderTrajectory(rec, inBatch);
  } catch (e) {
    showError(pane, e);
  }
}

function renderTrajectory(r: Rec, inBatch: boolean): void {
  const pieces = r.decoded!.response;
  const sampled = r.response_mask.reduce((n, m) => n + m, 0);
  const terminated = r.extra_fields.terminated_by as string | undefined;
  const summary = h(
    "dl",
    { class: "summary" },
    ...(
      [
        ["key", r.key],
        ["agent", r.agent_name],
        ["reward", fmt(r.reward_score, 3)],
        ...(groundTruth(r) === null ? [] : ([["ground_truth", groundTruth(r)!]] as const)),
        ["turns", String(r.num_turns)],
        ["finish", r.finish_reason + (terminated ? ` (${terminated})` : "")],
        ["truncated", r.truncated ? "yes" : "no"],
        ["tokens", `prompt ${r.prompt_ids.length} · sampled ${sampled} · observation ${r.response_ids.length - sampled}`],
        ["seconds", `generate ${fmt(r.metrics.generate_sequences)} · tools ${fmt(r.metrics.tool_calls)} · score ${fmt(r.metrics.compute_score)}`],
      ] as const
    ).flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k }, v)]),
  );
  // Policy versions (extra_fields.token_versions): a label where each version's tokens start.
  const versions = versionStarts(r.extra_fields.token_versions, r.response_ids.length);
  if (versions.size) summary.append(h("dt", {}, "versions"), h("dd", { "data-field": "versions" }, [...versions].map(([i, v]) => `${v} from #${i}`).join(" · ")));
  // Routed experts (R3): the shape here, each token's experts on hover.
  if (r.routed_experts_shape) summary.append(h("dt", {}, "experts"), h("dd", { "data-field": "experts" }, `${r.routed_experts_shape[0]} layers × top-${r.routed_experts_shape[1]} per token (hover a token)`));
  // In a batch: open this prompt's group (its n samples side by side).
  if (inBatch) summary.append(h("dt", {}, "group"), h("dd", {}, h("button", { class: "group-open", "data-uid": r.uid, id: "open-group" }, `compare the samples of ${r.uid}`)));
  const parts: Node[] = [summary];
  if (r.error) parts.push(h("p", { class: "error" }, `error: ${r.error}`));
  parts.push(
    h(
      "p",
      { class: "legend" },
      h("span", { class: "tok p" }, "prompt"),
      " ",
      h("span", { class: "tok s" }, "sampled (mask 1)"),
      " ",
      h("span", { class: "tok o" }, "observation (mask 0)"),
      " ",
      h("span", { class: "tok s call" }, "tool call"),
      " — hover the response for the log-prob heat (green likely → red unlikely)",
    ),
  );
  const prompt = h("div", { class: "tokens prompt" });
  const P = r.prompt_ids.length;
  const promptImages = imageRuns(r.multi_modal?.images, 0, P);
  let padEnd = -1;
  r.decoded!.prompt.forEach((p, i) => {
    const run = promptImages.get(i);
    if (run) {
      prompt.append(thumbnail(run.image, i));
      padEnd = run.end;
    }
    prompt.append(h("span", { class: i < padEnd ? "tok p pad" : "tok p", "data-i": i, "data-id": r.prompt_ids[i] }, p));
  });
  const nImages = r.multi_modal?.images.length ?? 0;
  if (nImages) summary.append(h("dt", {}, "images"), h("dd", { "data-field": "images" }, `${nImages} (${r.multi_modal!.images.filter((x) => x.source === "prompt").length} in the prompt), shown at their placeholders`));
  parts.push(h("details", {}, h("summary", {}, `prompt (${r.prompt_ids.length} tokens)`), prompt));

  const resp = h("div", { class: "tokens resp", id: "response" });
  const respImages = imageRuns(r.multi_modal?.images, P, P + r.response_ids.length);
  let respPadEnd = -1;
  for (const seg of segments(r.response_mask, pieces)) {
    resp.append(h("div", { class: `turn-mark ${seg.kind}`, "data-kind": seg.kind }, seg.kind === "sampled" ? seg.label : `${seg.label} ${seg.n}`));
    const calls = seg.kind === "sampled" ? toolCallTokens(pieces, seg.start, seg.end) : new Set<number>();
    for (let i = seg.start; i < seg.end; i++) {
      const v = versions.get(i);
      if (v !== undefined) resp.append(h("span", { class: "ver-mark", "data-version": v, "data-start": i, title: `policy version ${v} from response token #${i}` }, v));
      const lp = r.rollout_log_probs?.[i];
      const run = respImages.get(i);
      if (run) {
        resp.append(thumbnail(run.image, P + i));
        respPadEnd = run.end;
      }
      const el = h("span", {
        class: `tok ${seg.kind === "sampled" ? "s" : "o"}${calls.has(i) ? " call" : ""}${i < respPadEnd ? " pad" : ""}`,
        "data-i": i,
        "data-mask": r.response_mask[i],
        "data-id": r.response_ids[i],
        "data-lp": lp ?? undefined,
        "data-tlp": r.teacher_log_probs?.[i],
      });
      el.textContent = pieces[i] ?? "";
      if (seg.kind === "sampled") el.style.setProperty("--h", heat(lp).toFixed(3));
      resp.append(el);
    }
  }
  if (r.truncated) resp.append(h("div", { class: "trunc-mark", id: "truncation" }, `✂ truncated here (${r.finish_reason}${terminated ? `, ${terminated}` : ""}) after ${r.response_ids.length} response tokens`));
  const truth = groundTruth(r);
  resp.append(h("div", { class: "reward-mark", id: "reward-mark" }, `reward ${fmt(r.reward_score, 3)}${truth === null ? "" : ` · ground truth ${truth}`}`));
  parts.push(resp, h("div", { class: "hover-info", id: "hover-info" }, "hover a token"));
  $("detail").replaceChildren(...parts);

  resp.addEventListener("mouseover", (ev) => {
    const t = (ev.target as HTMLElement).closest<HTMLElement>(".tok");
    if (!t) return;
    const i = Number(t.dataset.i);
    const lp = t.dataset.lp === undefined ? null : Number(t.dataset.lp);
    const tlp = t.dataset.tlp === undefined ? null : Number(t.dataset.tlp);
    $("hover-info").textContent =
      `#${i}  id ${t.dataset.id}  ${JSON.stringify(pieces[i] ?? "")}  mask ${t.dataset.mask}` +
      (lp === null || t.dataset.mask === "0" ? "" : `  log-prob ${lp.toFixed(4)}  p ${Math.exp(lp).toFixed(3)}`) +
      routedExpertsHover(r, r.prompt_ids.length + i) +
      (tlp === null || t.dataset.mask === "0" ? "" : `  teacher ${tlp.toFixed(4)}`);
  });
}

/** The hover text's routed-experts part for position `pos` of prompt ‖ response ("" when the record has none). */
function routedExpertsHover(r: Rec, pos: number): string {
  const e = expertsAt(r.routed_experts, r.routed_experts_shape, pos);
  return e === null ? "" : `  experts ${e}`;
}

// ---- one group: its n samples side by side ----------------------------------

/** Tokens of context shown before the group's first divergence in the aligned view. */
const GROUP_CONTEXT = 6;
/** Rows of the aligned token view rendered before "show all". */
const GROUP_ROWS = 400;

async function openGroup(uid: string, allRows = false): Promise<void> {
  if (currentBatch === null) return;
  setHash(`batch=${encodeURIComponent(currentBatch)}&group=${encodeURIComponent(uid)}`);
  openKey = null;
  for (const tr of document.querySelectorAll<HTMLElement>("tr[data-key]")) tr.classList.remove("active");
  const pane = $("detail");
  pane.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const g = (await (await api(`/v1/rollouts/${encodeURIComponent(currentBatch)}/groups/${encodeURIComponent(uid)}?decode=1`)).json()) as {
      uid: string;
      records: Rec[];
      divergence: GroupDivergence;
    };
    renderGroup(g.uid, g.records, g.divergence, allRows);
  } catch (e) {
    showError(pane, e);
  }
}

function renderGroup(uid: string, recs: Rec[], div: GroupDivergence, allRows: boolean): void {
  const pane = $("detail");
  if (recs.length === 0) {
    pane.replaceChildren(h("p", { class: "muted" }, `group ${uid}: no finished trajectory yet`));
    return;
  }
  const seqs = recs.map((r) => [...r.prompt_ids, ...r.response_ids]);
  const pieces = recs.map((r) => [...r.decoded!.prompt, ...r.decoded!.response]);
  const at = new Map(div.samples.map((s) => [s.key, s]));
  const promptLen = Math.min(...recs.map((r) => r.prompt_ids.length));
  const pos = (p: number, r: Rec) => (p >= r.prompt_ids.length ? `#${p} (response #${p - r.prompt_ids.length})` : `#${p} (prompt)`);

  const head = (r: Rec, i: number) =>
    h("th", { "data-sample": i }, h("a", { href: `#batch=${encodeURIComponent(currentBatch!)}&key=${encodeURIComponent(r.key)}`, title: `open ${r.key}` }, `session ${r.session_id}${r.output_index ? ` · output ${r.output_index}` : ""}`));
  const row = (label: string, field: string, cell: (r: Rec, i: number) => Node | string) =>
    h("tr", {}, h("th", {}, label), ...recs.map((r, i) => h("td", { "data-field": field, "data-sample": i }, cell(r, i))));
  const summary = h(
    "table",
    { class: "group-summary", id: "group-summary" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), ...recs.map(head))),
    h(
      "tbody",
      {},
      row("key", "key", (r) => r.key),
      row("reward", "reward", (r) => fmt(r.reward_score, 3)),
      ...(recs.some((r) => groundTruth(r) !== null) ? [row("ground truth", "ground_truth", (r) => groundTruth(r) ?? "–")] : []),
      row("response", "length", (r) => {
        const sampled = r.response_mask.reduce((n, m) => n + m, 0);
        return `${r.response_ids.length} tokens (${sampled} sampled · ${r.response_ids.length - sampled} obs)`;
      }),
      row("turns", "turns", (r) => String(r.num_turns)),
      row("finish", "finish", (r) => `${r.error ? "failed" : "ok"} · ${r.finish_reason}${r.truncated ? " · truncated" : ""}`),
      row("diverges at", "diverges", (r) => {
        const d = at.get(r.key);
        if (!d) return "–";
        if (d.kind === "identical") return "all samples identical";
        const with_ = d.same_as.length ? ` (with ${d.same_as.map((k) => k.slice(k.indexOf("_") + 1)).join(", ")}, equal to it)` : "";
        return `${pos(d.at, r)} · ${d.kind === "ended" ? "ends; " : "leaves "}${d.nearest}${d.kind === "ended" ? " goes on" : ""}${with_}`;
      }),
      row("there", "context", (r, i) => {
        const d = at.get(r.key);
        if (!d) return "–";
        const t = textAround(pieces[i]!, d.at);
        return h("span", { class: "ctx" }, t.before, h("mark", {}, t.at === "" ? "∅ end" : t.at), t.after);
      }),
    ),
  );

  // Token-by-token from a little before the first divergence, one row per position, one column per sample.
  const start = Math.max(0, Math.min(div.common_prefix, ...div.samples.map((s) => s.at)) - GROUP_CONTEXT);
  const end = Math.max(...seqs.map((s) => s.length));
  const last = allRows ? end : Math.min(end, start + GROUP_ROWS);
  const grid = h("tbody", {});
  for (let p = start; p < last; p++) {
    const ids = seqs.map((s) => s[p]);
    const differs = ids.some((x) => x !== ids[0]);
    const tr = h("tr", { "data-pos": p, class: differs ? "differs" : "" }, h("th", { class: "num" }, p >= promptLen ? `r${p - promptLen}` : `p${p}`));
    recs.forEach((r, i) => {
      const id = ids[i];
      if (id === undefined) {
        tr.append(h("td", { class: "gone", "data-sample": i, "data-pos": p }, ""));
        return;
      }
      const inPrompt = p < r.prompt_ids.length;
      const m = inPrompt ? null : r.response_mask[p - r.prompt_ids.length];
      const d = at.get(r.key);
      const cls = `tok ${inPrompt ? "p" : m === 1 ? "s" : "o"}${d && d.at === p ? " div" : ""}`;
      tr.append(h("td", { class: cls, "data-sample": i, "data-pos": p, "data-id": id, title: `#${p} id ${id}` }, visibleToken(pieces[i]![p] ?? "")));
    });
    grid.append(tr);
  }
  const parts: Node[] = [
    h("h2", {}, `group ${uid} · ${recs.length} samples`),
    summary,
    h(
      "p",
      { class: "muted", id: "group-common" },
      `all ${recs.length} share the first ${div.common_prefix} tokens (prompt ${promptLen}); `,
      "positions from ",
      String(start),
      ": rows where the samples differ are marked, each sample's divergence point outlined",
    ),
    h("table", { class: "group-tokens", id: "group-tokens" }, h("thead", {}, h("tr", {}, h("th", {}, "pos"), ...recs.map(head))), grid),
  ];
  if (last < end) {
    const more = h("button", { id: "group-all", class: "more" }, `show all ${end - start} positions`);
    more.addEventListener("click", () => void openGroup(uid, true));
    parts.push(more);
  }
  pane.replaceChildren(...parts);
}

// ---- wiring --------------------------------------------------------------

function route(): void {
  const q = new URLSearchParams(location.hash.slice(1));
  const batch = q.get("batch");
  const key = q.get("key");
  const group = q.get("group");
  if (batch && batch !== currentBatch) void openBatch(batch);
  if (key) void openTrajectory(key, batch !== null && batch === currentBatch);
  else if (group && batch) void openGroup(group);
}

document.addEventListener("DOMContentLoaded", () => {
  forgetStoredToken();
  ($("token") as HTMLInputElement).value = token();
  $("auth").hidden = token() === "";
  $("token").addEventListener("change", (e) => {
    sessionStorage.setItem(TOKEN_KEY, (e.target as HTMLInputElement).value.trim());
    void loadBatches();
  });
  $("batches").addEventListener("click", (e) => {
    const t = e.target as HTMLElement;
    if (t.closest("#more-batches")) return void loadBatches(true);
    const b = t.closest<HTMLElement>("[data-batch]");
    if (b) void openBatch(b.dataset.batch!);
  });
  $("trajectories").addEventListener("click", (e) => {
    const t = e.target as HTMLElement;
    if (t.closest("#more-trajectories")) return void loadTrajectories(true);
    const g = t.closest<HTMLElement>("[data-uid]");
    if (g) return void openGroup(g.dataset.uid!);
    const tr = t.closest<HTMLElement>("tr[data-key]");
    if (tr) void openTrajectory(tr.dataset.key!);
  });
  // Filters and page size ask the server again (debounced while typing a bound).
  let typing: ReturnType<typeof setTimeout> | undefined;
  for (const id of ["f-status", "f-truncated", "f-limit"]) $(id).addEventListener("change", () => void loadTrajectories(false));
  for (const id of ["f-rmin", "f-rmax"])
    $(id).addEventListener("input", () => {
      clearTimeout(typing);
      delete $("trajectories").dataset.loaded;
      typing = setTimeout(() => void loadTrajectories(false), 250);
    });
  $("detail").addEventListener("click", (e) => {
    const g = (e.target as HTMLElement).closest<HTMLElement>("#open-group");
    if (g) void openGroup(g.dataset.uid!);
  });
  $("open-key").addEventListener("submit", (e) => {
    e.preventDefault();
    const k = ($("key-input") as HTMLInputElement).value.trim();
    if (k) void openTrajectory(k);
  });
  $("refresh").addEventListener("click", () => void loadBatches());
  window.addEventListener("hashchange", () => {
    if (location.hash.slice(1) !== ownHash) route();
  });
  void loadBatches().then(route);
});
