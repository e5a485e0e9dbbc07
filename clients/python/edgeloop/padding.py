"""A trainer-ready padded batch from complete groups, as verl's agent loop builds its ``DataProto``.

Follows verl's ``AgentLoopWorker`` post-processing
(``verl/experimental/agent_loop/agent_loop.py``, ``_agent_loop_postprocess`` and
``_postprocess``): every prompt is padded on the LEFT to ``prompt_length``
(``tokenizer.padding_side = "left"``, ``padding="max_length"``), every response
on the RIGHT to ``response_length``; ``attention_mask`` is the concatenation of
both pad masks; ``response_mask`` is the record's mask times the response's
attention mask; ``rollout_log_probs`` is right-padded with ``0.0``;
``position_ids = clip(cumsum(attention_mask, -1) - 1, min=0)``
(``verl.utils.model.compute_position_id_with_mask``), so left pads sit at 0 and
right pads repeat the last position; ``rm_scores`` carries the reward at the
last response token (``_postprocess``).
"""

import logging

import numpy as np

_log = logging.getLogger("edgeloop")

__all__ = ["to_padded"]


def _records(groups, include_failed):
    """The records to pad, with each one's group size: ``(records, group_n, group_kept, dropped_keys)``.

    ``group_n[i]``: sessions record i's group expected (:attr:`Group.n`; for a bare record dict, the number
    of records of its ``uid`` passed in, failed ones included). ``group_kept[i]``: rows of that group in
    the batch. ``dropped_keys``: keys of the failed records left out.
    """
    out, group_n, group_kept, dropped = [], [], [], []
    loose = {}
    for g in groups:
        if hasattr(g, "records"):
            kept = []
            for r in g.records:
                if include_failed or r.get("error") is None:
                    kept.append(r)
                else:
                    dropped.append(r.get("key"))
            out.extend(kept)
            group_n.extend([int(g.n)] * len(kept))
            group_kept.extend([len(kept)] * len(kept))
        else:
            loose.setdefault(g.get("uid"), []).append(g)
            out.append(g)
            group_n.append(None)
            group_kept.append(None)
    if loose:
        # Bare records: a group is the records of one uid passed in; dropped ones leave the list here.
        kept_by_uid = {u: sum(1 for r in rs if include_failed or r.get("error") is None) for u, rs in loose.items()}
        rows = []
        for r, n, k in zip(out, group_n, group_kept):
            if n is not None:
                rows.append((r, n, k))
            elif include_failed or r.get("error") is None:
                rows.append((r, len(loose[r.get("uid")]), kept_by_uid[r.get("uid")]))
            else:
                dropped.append(r.get("key"))
        out = [r for r, _, _ in rows]
        group_n = [n for _, n, _ in rows]
        group_kept = [k for _, _, k in rows]
    return out, group_n, group_kept, dropped


def _all_or_none(recs, name):
    have = [r.get(name) is not None for r in recs]
    if all(have) and recs:
        return True
    if any(have):
        missing = recs[have.index(False)].get("key")
        raise ValueError(f"{name} is present on some records but not on {missing}: a batch needs it on all or none")
    return False


def _one_model(recs):
    """The one ``model`` ({name, fingerprint}) the records name, or None; raises ValueError when they name two."""
    seen = None
    for r in recs:
        m = r.get("model")
        if m is None:
            continue
        if seen is None:
            seen = (m, r.get("key"))
        elif m.get("fingerprint") != seen[0].get("fingerprint"):
            raise ValueError(
                f"records {seen[1]} and {r.get('key')} hold token ids of two models "
                f"({seen[0].get('name')} {seen[0].get('fingerprint')}, {m.get('name')} {m.get('fingerprint')}): "
                "a batch of two tokenizers cannot be trained on as one"
            )
    return None if seen is None else seen[0]


def to_padded(groups, pad_token_id, prompt_length=None, response_length=None, include_failed=False):
    """Pads the records of ``groups`` into one batch of numpy arrays (B = records, P = prompt_length, R = response_length).

    ``groups``: :class:`~edgeloop.reader.Group` objects (or record dicts), in
    order; records follow their group's order (``session_id``, ``output_index``).
    ``pad_token_id``: the token id pads get in ``input_ids``/``prompts``/``responses``.
    ``prompt_length`` / ``response_length``: the padded widths (verl's
    ``rollout.prompt_length`` / ``response_length``); default the batch's longest.
    ``include_failed``: keep records whose ``error`` is set. **Default False: failed records are
    dropped**, so a group of 4 with 1 failed record gives 3 rows (a failed trajectory is not trained
    on; its arrays are usually empty). The count is returned (``dropped``, ``dropped_keys``) and logged
    at WARNING on the ``edgeloop`` logger, and each row carries its group's size (``group_n``,
    ``group_kept``) so a GRPO baseline can say which samples it averages over.

    Returns a dict:

    - ``input_ids`` int64 ``[B, P+R]`` (``prompts ‖ responses``), ``prompts`` int64 ``[B, P]``, ``responses`` int64 ``[B, R]``;
    - ``attention_mask`` int64 ``[B, P+R]`` (1 on real tokens);
    - ``position_ids`` int64 ``[B, P+R]``;
    - ``response_mask`` int64 ``[B, R]`` (1 on model-sampled tokens; 0 on observation tokens and pads);
    - ``rollout_log_probs`` float32 ``[B, R]`` (pads 0.0), or None when the records have none;
    - ``teacher_log_probs`` float32 ``[B, R]`` (pads 0.0), or None when the records have none;
    - ``routed_experts`` int32 ``[B, P+R, layers, top_k]`` aligned with ``input_ids`` (pads 0), or None
      when no record has them; a record without them among records with them (its trajectory made no
      engine call) gets the fill value 0 on every row;
    - ``rewards`` float32 ``[B]`` (``reward_score``; NaN when the record has none, e.g. an abandoned
      agent-gateway session or a failed reward; those keys are logged at WARNING);
    - ``rm_scores`` float32 ``[B, R]``: the reward at each row's last response token, 0 elsewhere;
    - ``uid`` object ``[B]`` (GRPO's grouping key), ``key`` object ``[B]``;
    - ``group_n`` int64 ``[B]``: the sessions the row's group expected (``Group.n``, the batch's
      ``rollout.n``; for bare record dicts, the records of that ``uid`` passed in, failed included);
    - ``group_kept`` int64 ``[B]``: the rows of the row's group in this batch (its records minus the
      failed ones dropped; with several outputs per session it may exceed ``group_n``); a group
      mean over the batch's rows averages ``group_kept`` samples, not ``group_n``;
    - ``dropped`` int: failed records left out (0 with ``include_failed=True``), ``dropped_keys``
      list of their keys, in input order;
    - ``model``: the ``{name, fingerprint}`` the records name (the tokenizer of their ids), or None
      when none names one (records written before models were recorded).

    Integer dtypes are int64 as verl's tensors (``torch.long``), so
    ``torch.from_numpy`` gives them as verl builds them. Raises ``ValueError``
    when a record is longer than ``prompt_length``/``response_length`` (no
    silent truncation), when a record is a tree node (``deliver="tree"``: resolve it first), when
    log-probs are on some records only, or
    when records disagree on the routed experts' ``[layers, top_k]``, or when they name two models
    (token ids of two tokenizers).
    """
    recs, group_n, group_kept, dropped_keys = _records(groups, include_failed)
    # A tree node (``deliver="tree"``) holds only its tokens from ``branch_at`` on: padded as it is, its rows would
    # lack their context and their positions would start at 0. Whole records only.
    for r in recs:
        if r.get("tree_prompt_length") is not None:
            raise ValueError(
                f"record {r.get('key')} is a tree node (deliver='tree': its arrays start at branch_at "
                f"{r.get('branch_at')}); to_padded takes whole records: pass the group's records through "
                "edgeloop.resolve_tree first, or read with deliver='leaves'"
            )
    if dropped_keys:
        _log.warning("to_padded dropped %d failed record(s) (include_failed=False): %s", len(dropped_keys), ", ".join(map(str, dropped_keys)))
    model = _one_model(recs)
    B = len(recs)
    plens = np.array([r["prompt_ids"].shape[0] for r in recs], dtype=np.int64)
    rlens = np.array([r["response_ids"].shape[0] for r in recs], dtype=np.int64)
    P = int(plens.max(initial=0)) if prompt_length is None else int(prompt_length)
    R = int(rlens.max(initial=0)) if response_length is None else int(response_length)
    for i, r in enumerate(recs):
        if plens[i] > P:
            raise ValueError(f"record {r.get('key')} has {plens[i]} prompt tokens, more than prompt_length={P}")
        if rlens[i] > R:
            raise ValueError(f"record {r.get('key')} has {rlens[i]} response tokens, more than response_length={R}")

    prompts = np.full((B, P), pad_token_id, dtype=np.int64)
    responses = np.full((B, R), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((B, P + R), dtype=np.int64)
    response_mask = np.zeros((B, R), dtype=np.int64)
    has_lp = _all_or_none(recs, "rollout_log_probs")
    has_teacher = _all_or_none(recs, "teacher_log_probs")
    # Routed experts may be missing on a record whose trajectory made no engine call: its rows keep the fill value 0.
    has_experts = any(r.get("routed_experts") is not None for r in recs)
    logp = np.zeros((B, R), dtype=np.float32) if has_lp else None
    teacher = np.zeros((B, R), dtype=np.float32) if has_teacher else None
    experts = None
    if has_experts:
        shapes = {r["routed_experts"].shape[1:] for r in recs if r.get("routed_experts") is not None}
        if len(shapes) != 1:
            raise ValueError(f"records disagree on routed_experts [layers, top_k]: {sorted(shapes)}")
        experts = np.zeros((B, P + R) + shapes.pop(), dtype=np.int32)
    rewards = np.full(B, np.nan, dtype=np.float32)
    rm_scores = np.zeros((B, R), dtype=np.float32)

    for i, r in enumerate(recs):
        p, n = int(plens[i]), int(rlens[i])
        prompts[i, P - p:] = r["prompt_ids"]
        responses[i, :n] = r["response_ids"]
        attention_mask[i, P - p:P + n] = 1
        response_mask[i, :n] = r["response_mask"]
        if has_lp:
            logp[i, :n] = r["rollout_log_probs"]
        if has_teacher:
            teacher[i, :n] = r["teacher_log_probs"]
        if has_experts and r.get("routed_experts") is not None:
            experts[i, P - p:P + n] = r["routed_experts"]
        score = r.get("reward_score")
        if score is not None:
            rewards[i] = score
            if n > 0:
                rm_scores[i, n - 1] = score

    # A record with no reward (an abandoned gateway session, a reward that failed, a failed record kept) pads to NaN:
    # said once, so that a GRPO baseline over its group does not turn NaN unnoticed.
    unscored = [r.get("key") for r in recs if r.get("reward_score") is None]
    if unscored:
        _log.warning(
            "to_padded: %d record(s) have no reward_score, their rewards are NaN (a group mean over them is NaN; "
            "mask them with np.isnan(out['rewards']) or drop them): %s", len(unscored), ", ".join(map(str, unscored)))
    position_ids = np.clip(np.cumsum(attention_mask, axis=-1) - 1, 0, None)
    return {
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "prompts": prompts,
        "responses": responses,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_log_probs": logp,
        "teacher_log_probs": teacher,
        "routed_experts": experts,
        "rewards": rewards,
        "rm_scores": rm_scores,
        "uid": np.array([r.get("uid") for r in recs], dtype=object),
        "key": np.array([r.get("key") for r in recs], dtype=object),
        "group_n": np.array(group_n, dtype=np.int64),
        "group_kept": np.array(group_kept, dtype=np.int64),
        "dropped": len(dropped_keys),
        "dropped_keys": dropped_keys,
        "model": model,
    }
