/** A run of response tokens with the same mask: an assistant turn (sampled) or an observation. */
export interface Segment {
  kind: "sampled" | "observation";
  /** First token index (inclusive) and last (exclusive), in `response_ids`. */
  start: number;
  end: number;
  /** 1-based count of this kind so far: assistant turn n, observation n. */
  n: number;
  /** What an observation holds, from its text: a tool result, a user turn, or other template tokens. */
  label: string;
}

/**
 * Splits a response into its mask runs. Observations are labelled by their
 * text: `tool result` (holds `<tool_response>`), `user` (a user turn), else
 * `observation`.
 */
export function segments(mask: readonly number[], pieces: readonly string[]): Segment[] {
  const out: Segment[] = [];
  let turns = 0;
  let obs = 0;
  for (let i = 0; i < mask.length; ) {
    const m = mask[i];
    let j = i;
    while (j < mask.length && mask[j] === m) j++;
    if (m === 1) out.push({ kind: "sampled", start: i, end: j, n: ++turns, label: `assistant turn ${turns}` });
    else {
      const text = pieces.slice(i, j).join("");
      const what = text.includes("<tool_response>") ? "tool result" : /<\|im_start\|>user/.test(text) ? "user" : "observation";
      out.push({ kind: "observation", start: i, end: j, n: ++obs, label: what });
    }
    i = j;
  }
  return out;
}

/**
 * Indices of the tokens inside `<tool_call>…</tool_call>` (tags included)
 * within `[start, end)`, found on the decoded text of the tokens. Linear in
 * the tokens and the calls.
 */
export function toolCallTokens(pieces: readonly string[], start: number, end: number): Set<number> {
  const inCall = new Set<number>();
  let text = "";
  const ends: number[] = [];
  for (let i = start; i < end; i++) {
    text += pieces[i] ?? "";
    ends.push(text.length);
  }
  const re = /<tool_call>[\s\S]*?(<\/tool_call>|$)/g;
  // Calls come in text order: one pointer walks the tokens (token k covers [ends[k-1], ends[k])),
  // so the cost is the tokens plus the calls, not their product.
  let k = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m[0].length === 0) break;
    const a = m.index;
    const b = m.index + m[0].length;
    while (k < ends.length && ends[k]! <= a) k++;
    for (let j = k; j < ends.length && (j === 0 ? 0 : ends[j - 1]!) < b; j++) inCall.add(start + j);
  }
  return inCall;
}

/** Heat of a log-prob for the hover shade: 0 (certain, lp = 0) to 1 (lp ≤ −4). */
export function heat(logprob: number | null | undefined): number {
  if (logprob == null || !Number.isFinite(logprob)) return 0;
  return Math.min(1, Math.max(0, -logprob / 4));
}

/**
 * Where the policy version changes in a response, from a record's
 * `extra_fields.token_versions` (run-length `[[start, version], …]` over
 * `response_ids`): start index → the version as text (`unknown` for null).
 * Anything not of that shape, and starts outside `[0, length)`, give nothing.
 */
export function versionStarts(tokenVersions: unknown, length: number): Map<number, string> {
  const out = new Map<number, string>();
  if (!Array.isArray(tokenVersions)) return out;
  for (const seg of tokenVersions) {
    if (!Array.isArray(seg) || seg.length !== 2) continue;
    const [start, v] = seg as [unknown, unknown];
    if (typeof start !== "number" || !Number.isInteger(start) || start < 0 || start >= length) continue;
    out.set(start, v === null || v === undefined ? "unknown" : typeof v === "string" ? v : JSON.stringify(v));
  }
  return out;
}

/**
 * The routed experts of one token of `prompt ‖ response` (position `pos`),
 * as `l0 [3 4] l1 [0 1]` (layer, then its top_k expert ids), from a record's
 * flat `routed_experts` and `routed_experts_shape: [layers, top_k]`; null
 * when the record has none or `pos` is outside them.
 */
export function expertsAt(experts: readonly number[] | undefined, shape: readonly number[] | undefined, pos: number): string | null {
  if (!experts || !shape || shape.length !== 2) return null;
  const [layers, topK] = shape as [number, number];
  const per = layers * topK;
  if (!(per > 0) || pos < 0 || (pos + 1) * per > experts.length) return null;
  const rows: string[] = [];
  for (let l = 0; l < layers; l++) rows.push(`l${l} [${experts.slice(pos * per + l * topK, pos * per + (l + 1) * topK).join(" ")}]`);
  return rows.join(" ");
}

/**
 * A token's text as a cell of the group view shows it: newlines as `↵`, tabs
 * as `⇥`, and a token made only of spaces as `␣` per space (so it is seen).
 */
export function visibleToken(text: string): string {
  if (text !== "" && /^ +$/.test(text)) return "␣".repeat(text.length);
  return text.replaceAll("\n", "↵").replaceAll("\t", "⇥");
}

/**
 * The batch view's sandbox line from `GET /v1/sandboxes` (null when the
 * deployment has no sandbox lifecycle or the reply is not its shape):
 * `sandboxes  2 live · 1 creating · 0 releasing (≤ 256) · 40 created · 3 failed creates · released: finished 35, reaped_ttl 2`.
 */
export function sandboxLine(body: unknown): string | null {
  const b = body as { enabled?: unknown; spec?: { max_live?: unknown }; store?: { live?: unknown; creating?: unknown; releasing?: unknown; counters?: Record<string, unknown> } } | null;
  if (!b || b.enabled !== true || !b.store || typeof b.store.live !== "number") return null;
  const c = b.store.counters ?? {};
  const n = (k: string) => (typeof c[k] === "number" ? (c[k] as number) : 0);
  const released = Object.entries(c)
    .filter(([k, v]) => k.startsWith("released:") && typeof v === "number" && v > 0)
    .map(([k, v]) => `${k.slice("released:".length)} ${v as number}`);
  const cap = typeof b.spec?.max_live === "number" ? ` (≤ ${b.spec.max_live})` : "";
  return `sandboxes  ${b.store.live} live · ${String(b.store.creating ?? 0)} creating · ${String(b.store.releasing ?? 0)} releasing${cap} · ${n("confirmed")} created · ${n("create_failed")} failed creates${released.length ? ` · released: ${released.join(", ")}` : ""}`;
}

/** One image of a record's `multi_modal.images` (the fields the viewer reads). */
export interface ViewerImage {
  sha256: string;
  mime: string;
  width: number;
  height: number;
  data?: string;
  span: [number, number];
  source: string;
  field: string;
}

const IMAGE_MIMES = new Set(["image/png", "image/jpeg", "image/webp", "image/gif"]);
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/**
 * The images of a record by the first pad of their span, in `[from, to)` of
 * prompt ‖ response positions, keyed by index relative to `from` (a prompt:
 * from 0; the response: from the prompt's length): `end` is where the pads
 * stop (relative too). Images whose span is malformed are left out.
 */
export function imageRuns(images: readonly ViewerImage[] | undefined, from: number, to: number): Map<number, { image: ViewerImage; end: number }> {
  const out = new Map<number, { image: ViewerImage; end: number }>();
  for (const image of images ?? []) {
    const [s, e] = image.span ?? [];
    if (!Number.isInteger(s) || !Number.isInteger(e) || s! >= e! || s! < from || e! > to) continue;
    out.set(s! - from, { image, end: e! - from });
  }
  return out;
}

/**
 * The `src` of an image's thumbnail: a `data:` URI of its inline bytes, only
 * for a known image type and a base64 payload (a record is data, never
 * markup); null when the record holds no bytes for it (over the inline cap).
 */
export function thumbnailSrc(image: ViewerImage): string | null {
  if (typeof image.data !== "string" || !IMAGE_MIMES.has(image.mime) || !BASE64.test(image.data)) return null;
  return `data:${image.mime};base64,${image.data}`;
}
