import { InputError } from "../errors.ts";
import type { TrajectoryRecord } from "../schema/index.ts";
import type { CompleteGroup } from "./types.ts";

/**
 * How a read delivers a group's records (read option `deliver`, issue 30
 * item 5):
 * - `leaves` (default): every record is a whole trajectory, as stored: a
 *   branch of a trajectory tree repeats its parent's tokens before `branch_at`.
 * - `tree`: every record whose parent (`parent_key`) is delivered in the same
 *   group is a **tree node**: its arrays hold only its own tokens, those from
 *   `branch_at` on (see {@link treeNode}), and `tree_prompt_length` says where
 *   the whole trajectory's prompt ends. Roots, records of loops that build no
 *   trees and records whose parent is not delivered (another role's, a
 *   failed one) stay whole. {@link resolveTree} gives the leaves back.
 */
export type TreeDelivery = "leaves" | "tree";

/** Checks the read option `deliver`; undefined reads as `leaves`. Throws {@link InputError} (`deliver`). */
export function checkDelivery(v: unknown): TreeDelivery {
  if (v === undefined || v === "leaves" || v === "tree") return v ?? "leaves";
  throw new InputError("deliver", `must be "leaves" or "tree", got ${typeof v === "string" ? JSON.stringify(v.slice(0, 100)) : typeof v}`);
}

/** A record's `prompt_ids ‖ response_ids` length. */
function pathLength(r: TrajectoryRecord): number {
  return r.prompt_ids.length + r.response_ids.length;
}

/**
 * Whether `child`'s tokens before `at` are `parent`'s, token for token, and
 * every one of them in `child`'s response is in `parent`'s response with the
 * same mask and log-prob (the tree invariant of docs/queue-layout.md), and
 * its routed-expert rows before `at` are `parent`'s. One pass over `at`
 * positions (and their expert rows).
 */
function sharesPrefix(parent: TrajectoryRecord, child: TrajectoryRecord, at: number): boolean {
  const pp = parent.prompt_ids.length;
  const cp = child.prompt_ids.length;
  if (at > pathLength(parent) || at > pathLength(child)) return false;
  for (let i = 0; i < at; i++) {
    const a = i < pp ? parent.prompt_ids[i] : parent.response_ids[i - pp];
    const b = i < cp ? child.prompt_ids[i] : child.response_ids[i - cp];
    if (a !== b) return false;
    if (i >= cp) {
      // A response position of the child: it must be a response position of the parent with the same mask and log-prob.
      if (i < pp) return false;
      if (parent.response_mask[i - pp] !== child.response_mask[i - cp]) return false;
      const lp = parent.rollout_log_probs;
      const lc = child.rollout_log_probs;
      if ((lp === null) !== (lc === null)) return false;
      if (lp && lc && !Object.is(lp[i - pp], lc[i - cp])) return false;
      const tp = parent.teacher_log_probs;
      const tc = child.teacher_log_probs;
      if ((tp === undefined) !== (tc === undefined)) return false;
      if (tp && tc && !Object.is(tp[i - pp], tc[i - cp])) return false;
    }
  }
  if (parent.routed_experts !== undefined || child.routed_experts !== undefined) {
    const s = parent.routed_experts_shape;
    const t = child.routed_experts_shape;
    if (!s || !t || s[0] !== t[0] || s[1] !== t[1]) return false;
    // The prefix rows too: they come from separate prefills of parent and branch, and a real engine need not
    // route them alike; a node keeps none of them, so they must be the parent's to be given back.
    const pe = parent.routed_experts;
    const ce = child.routed_experts;
    if (!pe || !ce) return false;
    const n = at * s[0] * s[1];
    if (pe.length < n || ce.length < n) return false;
    for (let i = 0; i < n; i++) if (pe[i] !== ce[i]) return false;
  }
  return true;
}

/**
 * The tree-node form of a branch record `child` whose first `child.branch_at`
 * tokens are `parent`'s: the same record with `prompt_ids`, `response_ids`,
 * `response_mask`, `rollout_log_probs`, `teacher_log_probs` and
 * `routed_experts` rows starting at token `branch_at` of `prompt_ids ‖
 * response_ids`, and `tree_prompt_length` = the whole `prompt_ids` length
 * (so `prompt_ids` here holds `max(0, tree_prompt_length − branch_at)`
 * tokens). The routed-expert rows of the shared prefix are then the
 * parent's. Offsets in `extra_fields` (`token_versions`, `abandoned`) stay
 * those of the whole trajectory. Returns `child` unchanged (whole) when it is
 * no branch or does not share the prefix it names (never cuts what it cannot
 * give back). Pure.
 */
export function treeNode(parent: TrajectoryRecord, child: TrajectoryRecord): TrajectoryRecord {
  const at = child.branch_at;
  if (at === null || at === undefined || child.tree_prompt_length !== undefined || !sharesPrefix(parent, child, at)) return child;
  const p = child.prompt_ids.length;
  const r0 = Math.max(0, at - p);
  const node: TrajectoryRecord = {
    ...child,
    prompt_ids: child.prompt_ids.slice(Math.min(at, p)),
    response_ids: child.response_ids.slice(r0),
    response_mask: child.response_mask.slice(r0),
    rollout_log_probs: child.rollout_log_probs === null ? null : child.rollout_log_probs.slice(r0),
    tree_prompt_length: p,
  };
  if (child.teacher_log_probs) node.teacher_log_probs = child.teacher_log_probs.slice(r0);
  if (child.routed_experts && child.routed_experts_shape) {
    const row = child.routed_experts_shape[0] * child.routed_experts_shape[1];
    node.routed_experts = child.routed_experts.slice(at * row);
  }
  return node;
}

/**
 * A group's records as tree nodes ({@link TreeDelivery} `tree`): each record
 * whose `parent_key` names a record of `records` is cut by {@link treeNode}
 * against that parent's whole trajectory. O(tokens of the group). Pure.
 */
export function treeNodes(records: TrajectoryRecord[]): TrajectoryRecord[] {
  const byKey = new Map(records.map((r) => [r.key, r]));
  return records.map((r) => {
    const parent = r.parent_key ? byKey.get(r.parent_key) : undefined;
    return parent && parent.error === null && r.error === null ? treeNode(parent, r) : r;
  });
}

/**
 * The whole trajectories of records delivered as a tree (the inverse of
 * {@link treeNodes}): every tree node (`tree_prompt_length` set) gets its
 * parent's first `branch_at` tokens back (ids, and in its response the
 * parent's mask, log-probs and teacher log-probs; routed-expert rows),
 * `tree_prompt_length` removed; other records are returned as they are.
 * Parents are resolved first, so nested branches resolve in one call.
 * @throws InputError (field `parent_key`) for a node whose parent is not
 *   among `records`, or (`branch_at`) when its parent is shorter than `branch_at`.
 */
export function resolveTree(records: TrajectoryRecord[]): TrajectoryRecord[] {
  const byKey = new Map(records.map((r) => [r.key, r]));
  const done = new Map<string, TrajectoryRecord>();
  const resolving = new Set<string>();
  const whole = (r: TrajectoryRecord): TrajectoryRecord => {
    const hit = done.get(r.key);
    if (hit) return hit;
    if (r.tree_prompt_length === undefined) {
      done.set(r.key, r);
      return r;
    }
    if (resolving.has(r.key)) throw new InputError("parent_key", `record ${r.key} is its own ancestor`);
    const raw = r.parent_key ? byKey.get(r.parent_key) : undefined;
    if (!raw) throw new InputError("parent_key", `tree node ${r.key} names parent ${String(r.parent_key)}, which is not among the records`);
    resolving.add(r.key);
    const parent = whole(raw);
    resolving.delete(r.key);
    const at = r.branch_at!;
    const P = r.tree_prompt_length;
    const pp = parent.prompt_ids.length;
    if (at > pathLength(parent)) throw new InputError("branch_at", `tree node ${r.key} branches at ${at}, past its parent's ${pathLength(parent)} tokens`);
    const ids = (i: number) => (i < pp ? parent.prompt_ids[i]! : parent.response_ids[i - pp]!);
    const prompt: number[] = [];
    for (let i = 0; i < Math.min(at, P); i++) prompt.push(ids(i));
    prompt.push(...r.prompt_ids);
    // The child's response positions P..at−1 are the parent's response positions (checked when the node was cut).
    const from = Math.max(0, at - P);
    const span = <T>(arr: readonly T[]) => arr.slice(P - pp, P - pp + from);
    const out: TrajectoryRecord = {
      ...r,
      prompt_ids: prompt,
      response_ids: [...span(parent.response_ids), ...r.response_ids],
      response_mask: [...span(parent.response_mask), ...r.response_mask],
      rollout_log_probs: r.rollout_log_probs === null || parent.rollout_log_probs === null ? r.rollout_log_probs : [...span(parent.rollout_log_probs), ...r.rollout_log_probs],
    };
    delete out.tree_prompt_length;
    if (r.teacher_log_probs && parent.teacher_log_probs) out.teacher_log_probs = [...span(parent.teacher_log_probs), ...r.teacher_log_probs];
    if (r.routed_experts && r.routed_experts_shape && parent.routed_experts) {
      const row = r.routed_experts_shape[0] * r.routed_experts_shape[1];
      out.routed_experts = [...parent.routed_experts.slice(0, at * row), ...r.routed_experts];
    }
    done.set(r.key, out);
    return out;
  };
  return records.map(whole);
}

/** The delivered groups in the form `deliver` asks ({@link TreeDelivery}); unchanged for `leaves`. */
export function deliverGroups(groups: CompleteGroup[], deliver: TreeDelivery): CompleteGroup[] {
  if (deliver === "leaves") return groups;
  return groups.map((g) => ({ ...g, records: treeNodes(g.records) }));
}
