import { ConflictError } from "../errors.ts";
import type { DatasetRow } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import type { BatchPlan } from "./batch.ts";

/** JSON with object keys sorted at every level, so that equal values give equal text whatever their key order. */
function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v) ?? "null";
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o).filter((k) => o[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
}

/**
 * The fingerprint of the prompt group a row defines (DESIGN §6: a `uid`
 * names one prompt): SHA-256 hex of the canonical JSON of what the group's
 * sessions run on — `prompt`, `data_source`, `agent_name`, `reward_model`,
 * and `extra_info.tools_kwargs` / `interaction_kwargs` (the environment).
 * Not included: `uid`, `extra_info.index` and other bookkeeping, which may
 * differ between two posts of one prompt. Key order does not matter.
 */
export async function groupFingerprint(row: DatasetRow): Promise<string> {
  const defining = {
    prompt: row.prompt,
    data_source: row.data_source,
    agent_name: row.agent_name ?? null,
    reward_model: row.reward_model ?? null,
    tools_kwargs: row.extra_info?.tools_kwargs ?? null,
    interaction_kwargs: row.extra_info?.interaction_kwargs ?? null,
  };
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonicalJson(defining)));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * uid → fingerprint for every group of `plan` whose row is valid (a row that
 * failed validation defines no prompt group), with the row index of each,
 * for `expectGroup` and the 409 of a uid re-posted with another prompt.
 */
export async function planFingerprints(plan: BatchPlan): Promise<Map<string, { fingerprint: string; row_index: number }>> {
  const out = new Map<string, { fingerprint: string; row_index: number }>();
  for (const t of plan.trajectories) {
    if (t.session_id !== 0 || !t.row || t.row_error) continue;
    out.set(t.uid, { fingerprint: await groupFingerprint(t.row), row_index: t.row_index });
  }
  return out;
}

/** `plan` with `fingerprints` set (uid → fingerprint of every valid row's prompt group), for `expectGroup` and {@link checkPlanGroups}. */
export async function withFingerprints(plan: BatchPlan): Promise<BatchPlan> {
  const fps = await planFingerprints(plan);
  plan.fingerprints = new Map([...fps].map(([uid, f]) => [uid, f.fingerprint]));
  return plan;
}

/** The uids of a batch whose group already existed (`reused_uids`), and those already complete (`complete_uids`). */
export interface GroupReuse {
  reused_uids: string[];
  complete_uids: string[];
}

/**
 * Reads every group of `plan` from the store and refuses the batch (409,
 * nothing written) when one is registered with another n or partition, or
 * with another prompt (its fingerprint differs: a uid names one prompt
 * group); returns the uids whose group already exists, and those already complete.
 * @throws ConflictError (409, field `rows[i].uid`, i the first row of the uid) naming the uid; StoreError (503).
 */
export async function checkPlanGroups(store: TransferQueue, plan: BatchPlan): Promise<GroupReuse> {
  const mode = plan.validate ? "val" : "train";
  const groups = [...plan.groups];
  const rowOf = new Map<string, number>();
  for (const t of plan.trajectories) if (!rowOf.has(t.uid)) rowOf.set(t.uid, t.row_index);
  const reused: string[] = [];
  const complete: string[] = [];
  for (let i = 0; i < groups.length; i += 256) {
    const chunk = groups.slice(i, i + 256);
    const statuses = await Promise.all(chunk.map(([uid]) => store.groupStatus(uid)));
    statuses.forEach((st, j) => {
      const [uid, n] = chunk[j]!;
      if (st.expected === null) return;
      const i = rowOf.get(uid)!;
      if (st.expected !== n || st.partition !== mode) {
        throw new ConflictError(
          `rows[${i}].uid: group ${uid} is registered with n=${st.expected} in ${st.partition}, not n=${n} in ${mode}: a uid names one group; use a new uid for new samples`,
          { field: `rows[${i}].uid` },
        );
      }
      const fp = plan.fingerprints?.get(uid);
      if (fp && st.fingerprint && fp !== st.fingerprint) {
        throw new ConflictError(`rows[${i}].uid: group ${uid} was registered with another prompt: a uid names one prompt group; use a new uid for new samples`, { field: `rows[${i}].uid` });
      }
      reused.push(uid);
      if (st.complete) complete.push(uid);
    });
  }
  return { reused_uids: reused, complete_uids: complete };
}
