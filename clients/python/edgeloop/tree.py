"""Trajectory trees in the transfer queue (docs/queue-layout.md, "Trees").

Records of an agent-gateway session name their place in the session's tree:
``parent_key`` (the record of the same group this one branched from, or
``None`` for a root) and ``branch_at`` (the token index into the parent's
``prompt_ids + response_ids`` where it branches; the record's tokens before it
are the parent's, token for token). Stored records are always whole
trajectories ("leaves"); :meth:`edgeloop.Reader.groups` with
``deliver="tree"`` gives each branch whose parent is in the same delivered
group as a **tree node**: its arrays hold only its tokens from ``branch_at`` on
and ``tree_prompt_length`` is the whole trajectory's prompt length.
:func:`resolve_tree` gives the whole records back. Both match the TypeScript
reader's ``treeNodes`` / ``resolveTree`` (shared/store/tree-delivery.ts).
"""

import numpy as np

__all__ = ["tree_nodes", "resolve_tree"]

_RESPONSE_ARRAYS = ("response_mask", "rollout_log_probs", "teacher_log_probs")


def _path(rec):
    return np.concatenate([rec["prompt_ids"], rec["response_ids"]])


def _shares_prefix(parent, child, at):
    pp, cp = parent["prompt_ids"].shape[0], child["prompt_ids"].shape[0]
    if at > pp + parent["response_ids"].shape[0] or at > cp + child["response_ids"].shape[0]:
        return False
    if not np.array_equal(_path(parent)[:at], _path(child)[:at]):
        return False
    if at > cp:
        # The child's response positions before ``at`` must be the parent's response positions, with the same values.
        if cp < pp:
            return False
        a, b = cp - pp, at - pp
        for name in _RESPONSE_ARRAYS:
            x, y = parent.get(name), child.get(name)
            if (x is None) != (y is None):
                return False
            if x is not None and not np.array_equal(x[a:b], y[: at - cp], equal_nan=True):
                return False
    if (parent.get("routed_experts") is None) != (child.get("routed_experts") is None):
        return False
    if parent.get("routed_experts") is not None:
        pe, ce = parent["routed_experts"], child["routed_experts"]
        if pe.shape[1:] != ce.shape[1:]:
            return False
        # The prefix rows too: separate prefills of parent and branch need not route alike, and a node keeps none.
        if pe.shape[0] < at or ce.shape[0] < at or not np.array_equal(pe[:at], ce[:at]):
            return False
    return True


def tree_node(parent, child):
    """``child`` cut to its tokens from ``child["branch_at"]`` on (a tree node), or ``child`` unchanged.

    The node keeps every field; ``prompt_ids`` holds ``max(0, P - branch_at)``
    tokens, the response arrays start at response index ``max(0, branch_at -
    P)``, ``routed_experts`` rows at token ``branch_at``, and
    ``tree_prompt_length`` = ``P`` (the whole prompt's length). A record that
    is no branch, or does not share the prefix it names, is returned whole.
    """
    at = child.get("branch_at")
    if at is None or child.get("tree_prompt_length") is not None or not _shares_prefix(parent, child, at):
        return child
    p = child["prompt_ids"].shape[0]
    r0 = max(0, at - p)
    node = dict(child)
    node["prompt_ids"] = child["prompt_ids"][min(at, p):]
    node["response_ids"] = child["response_ids"][r0:]
    for name in _RESPONSE_ARRAYS:
        if child.get(name) is not None:
            node[name] = child[name][r0:]
    if child.get("routed_experts") is not None:
        node["routed_experts"] = child["routed_experts"][at:]
    node["tree_prompt_length"] = p
    return node


def tree_nodes(records):
    """A group's records (list of record dicts) with every branch whose parent is among them cut by :func:`tree_node`."""
    by_key = {r.get("key"): r for r in records}
    out = []
    for r in records:
        parent = by_key.get(r.get("parent_key")) if r.get("parent_key") else None
        ok = parent is not None and parent.get("error") is None and r.get("error") is None
        out.append(tree_node(parent, r) if ok else r)
    return out


def resolve_tree(records):
    """The whole trajectories of records delivered as a tree (inverse of :func:`tree_nodes`).

    Every record with ``tree_prompt_length`` gets its parent's first
    ``branch_at`` tokens back (ids; in its response the parent's mask and
    log-probs; routed-expert rows) and loses ``tree_prompt_length``; others are
    returned as they are. Raises ``ValueError`` for a node whose parent is not
    among ``records`` or is shorter than ``branch_at``.
    """
    by_key = {r.get("key"): r for r in records}
    done = {}

    def whole(r, depth=0):
        k = r.get("key")
        if k in done:
            return done[k]
        if r.get("tree_prompt_length") is None:
            done[k] = r
            return r
        if depth > len(records):
            raise ValueError(f"tree node {k} is its own ancestor")
        raw = by_key.get(r.get("parent_key"))
        if raw is None:
            raise ValueError(f"tree node {k} names parent {r.get('parent_key')!r}, which is not among the records")
        parent = whole(raw, depth + 1)
        at, P = r["branch_at"], r["tree_prompt_length"]
        pp = parent["prompt_ids"].shape[0]
        path = _path(parent)
        if at > path.shape[0]:
            raise ValueError(f"tree node {k} branches at {at}, past its parent's {path.shape[0]} tokens")
        out = dict(r)
        del out["tree_prompt_length"]
        out["prompt_ids"] = np.concatenate([path[: min(at, P)], r["prompt_ids"]]).astype(r["prompt_ids"].dtype)
        a, b = P - pp, P - pp + max(0, at - P)
        out["response_ids"] = np.concatenate([parent["response_ids"][a:b], r["response_ids"]]).astype(r["response_ids"].dtype)
        for name in _RESPONSE_ARRAYS:
            if r.get(name) is not None and parent.get(name) is not None:
                out[name] = np.concatenate([parent[name][a:b], r[name]]).astype(r[name].dtype)
        if r.get("routed_experts") is not None and parent.get("routed_experts") is not None:
            out["routed_experts"] = np.concatenate([parent["routed_experts"][:at], r["routed_experts"]])
        done[k] = out
        return out

    return [whole(r) for r in records]
