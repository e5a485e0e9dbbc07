// The trajectory viewer (browser code, bundled by infra/viewer/build.ts into ../assets.generated.ts).
// It reads the same HTTP API a trainer uses: GET /v1/rollouts, the NDJSON stream of a batch's
// records, and GET /v1/trajectories/{key}?decode=1 for the per-token text (the browser has no tokenizer).
import { expertsAt, heat, segments, toolCallTokens, versionStarts } from "./segments.ts";

interface Rec {
  key: string;
  uid: string;
  session_id: number;
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

function token(): string {
  return localStorage.getItem("edgeloop.token") ?? "";
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

let records: Rec[] = [];
let currentBatch: string | null = null;
/** The hash this page set itself, so that its own hashchange is not routed again. */
let ownHash = "";

function setHash(h: string): void {
  ownHash = h;
  location.hash = h;
}

async function loadBatches(): Promise<void> {
  const list = $("batches");
  try {
    const { batches } = (await (await api("/v1/rollouts")).json()) as { batches: BatchSummary[] };
    if (batches.length === 0) {
      list.replaceChildren(h("p", { class: "muted" }, "No batches yet: POST /v1/rollouts."));
      return;
    }
    list.replaceChildren(
      ...batches.map((b) =>
        h(
          "button",
          { class: `batch${b.batch_id === currentBatch ? " active" : ""}`, "data-batch": b.batch_id, title: b.batch_id },
          h("span", { class: "bid" }, b.batch_id.slice(0, 8)),
          h("span", { class: b.done ? "done" : "running" }, b.done ? "done" : "running"),
          h("span", { title: "records ok / failed · sessions finished / planned" }, `${b.counts.ok}✓ ${b.counts.failed}✗ · ${b.counts.finished}/${b.counts.total}`),
          h("span", {}, `r̄ ${fmt(b.reward.mean, 2)}`),
        ),
      ),
    );
  } catch (e) {
    showError(list, e);
  }
}

async function openBatch(id: string): Promise<void> {
  currentBatch = id;
  records = [];
  setHash(`batch=${encodeURIComponent(id)}`);
  for (const b of document.querySelectorAll<HTMLElement>(".batch")) b.classList.toggle("active", b.dataset.batch === id);
  const table = $("trajectories");
  table.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const res = await api(`/v1/rollouts/${encodeURIComponent(id)}/trajectories`);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    let last = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      for (const l of lines) if (l.trim()) records.push(JSON.parse(l) as Rec);
      if (performance.now() - last > 250) {
        renderTrajectoryList();
        last = performance.now();
      }
    }
    if (buf.trim()) records.push(JSON.parse(buf) as Rec);
    renderTrajectoryList();
    $("trajectories").dataset.loaded = "1";
  } catch (e) {
    showError(table, e);
  }
}

function filtered(): Rec[] {
  const status = ($("f-status") as HTMLSelectElement).value;
  const trunc = ($("f-truncated") as HTMLSelectElement).value;
  const rmin = ($("f-rmin") as HTMLInputElement).value;
  const rmax = ($("f-rmax") as HTMLInputElement).value;
  return records.filter((r) => {
    if (status === "ok" && r.error !== null) return false;
    if (status === "failed" && r.error === null) return false;
    if (trunc === "yes" && !r.truncated) return false;
    if (trunc === "no" && r.truncated) return false;
    if (rmin !== "" && (r.reward_score === null || r.reward_score < Number(rmin))) return false;
    if (rmax !== "" && (r.reward_score === null || r.reward_score > Number(rmax))) return false;
    return true;
  });
}

function renderTrajectoryList(): void {
  const rows = filtered();
  const body = rows.map((r) => {
    const sampled = r.response_mask.reduce((n, m) => n + m, 0);
    return h(
      "tr",
      { "data-key": r.key, class: r.error ? "failed" : r.truncated ? "trunc" : "" },
      h("td", { class: "key" }, r.key),
      h("td", {}, r.error ? "failed" : "ok"),
      h("td", { class: "num" }, fmt(r.reward_score, 2)),
      h("td", {}, r.truncated ? "✂" : ""),
      h("td", { class: "num" }, String(r.num_turns)),
      h("td", { class: "num" }, `${sampled}/${r.response_ids.length - sampled}`),
    );
  });
  $("trajectories").replaceChildren(
    h("p", { class: "muted" }, `${rows.length} of ${records.length} trajectories`),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, ...["key", "status", "reward", "trunc", "turns", "sampled/obs"].map((c) => h("th", {}, c)))),
      h("tbody", {}, ...body),
    ),
  );
}

// ---- one trajectory ------------------------------------------------------

async function openTrajectory(key: string): Promise<void> {
  const inBatch = currentBatch !== null && records.some((r) => r.key === key);
  setHash(inBatch ? `batch=${encodeURIComponent(currentBatch!)}&key=${encodeURIComponent(key)}` : `key=${encodeURIComponent(key)}`);
  for (const tr of document.querySelectorAll<HTMLElement>("tr[data-key]")) tr.classList.toggle("active", tr.dataset.key === key);
  const pane = $("detail");
  pane.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const rec = (await (await api(`/v1/trajectories/${encodeURIComponent(key)}?decode=1`)).json()) as Rec;
    renderTrajectory(rec);
  } catch (e) {
    showError(pane, e);
  }
}

function renderTrajectory(r: Rec): void {
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
  r.decoded!.prompt.forEach((p, i) => prompt.append(h("span", { class: "tok p", "data-i": i, "data-id": r.prompt_ids[i] }, p)));
  parts.push(h("details", {}, h("summary", {}, `prompt (${r.prompt_ids.length} tokens)`), prompt));

  const resp = h("div", { class: "tokens resp", id: "response" });
  for (const seg of segments(r.response_mask, pieces)) {
    resp.append(h("div", { class: `turn-mark ${seg.kind}`, "data-kind": seg.kind }, seg.kind === "sampled" ? seg.label : `${seg.label} ${seg.n}`));
    const calls = seg.kind === "sampled" ? toolCallTokens(pieces, seg.start, seg.end) : new Set<number>();
    for (let i = seg.start; i < seg.end; i++) {
      const v = versions.get(i);
      if (v !== undefined) resp.append(h("span", { class: "ver-mark", "data-version": v, "data-start": i, title: `policy version ${v} from response token #${i}` }, v));
      const lp = r.rollout_log_probs?.[i];
      const el = h("span", {
        class: `tok ${seg.kind === "sampled" ? "s" : "o"}${calls.has(i) ? " call" : ""}`,
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
  resp.append(h("div", { class: "reward-mark" }, `reward ${fmt(r.reward_score, 3)}`));
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

// ---- wiring --------------------------------------------------------------

function route(): void {
  const q = new URLSearchParams(location.hash.slice(1));
  const batch = q.get("batch");
  const key = q.get("key");
  if (batch && batch !== currentBatch) void openBatch(batch);
  if (key) void openTrajectory(key);
}

document.addEventListener("DOMContentLoaded", () => {
  ($("token") as HTMLInputElement).value = token();
  $("auth").hidden = token() === "";
  $("token").addEventListener("change", (e) => {
    localStorage.setItem("edgeloop.token", (e.target as HTMLInputElement).value.trim());
    void loadBatches();
  });
  $("batches").addEventListener("click", (e) => {
    const b = (e.target as HTMLElement).closest<HTMLElement>("[data-batch]");
    if (b) void openBatch(b.dataset.batch!);
  });
  $("trajectories").addEventListener("click", (e) => {
    const tr = (e.target as HTMLElement).closest<HTMLElement>("tr[data-key]");
    if (tr) void openTrajectory(tr.dataset.key!);
  });
  for (const id of ["f-status", "f-truncated", "f-rmin", "f-rmax"]) $(id).addEventListener("input", renderTrajectoryList);
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
