"""Test and bench helper (not a unittest): reads groups with the edgeloop package and prints them as JSON.

Usage: python3 dump_groups.py --url REDIS_URL --prefix P [--partition train] [--expect N]
       [--submit API_URL --rows rows.jsonl [--token T]] [--pad-first PAD_ID] [--deliver tree]
       [--blobs file:///dir | s3://bucket/prefix]

With --submit, first POSTs the rows (edgeloop.submit) and prints its answer as "submitted".
Reads with Reader.groups until --expect groups arrived (waiting up to 60 s) or, without
--expect, until a read returns none; acks them; checks that a further read returns none.
Prints one JSON object: {submitted, groups: [{uid, delivery_id, n, failed, partition,
records: [record as JSON + "_bytes": {field: "<dtype>:<hex of the array's bytes>"}]}],
padded (the first group through to_padded, arrays as lists), acked, after_ack}. With
--deliver tree, groups are read as trajectory-tree nodes and each group also has "resolved":
its records through resolve_tree, as JSON.
"""

import argparse
from dataclasses import replace
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np  # noqa: E402

from edgeloop import Reader, record_to_json, resolve_tree, submit, to_padded  # noqa: E402

ARRAYS = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "teacher_log_probs", "routed_experts")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--partition", default="train")
    ap.add_argument("--expect", type=int, default=None)
    ap.add_argument("--submit", default=None)
    ap.add_argument("--rows", default=None)
    ap.add_argument("--token", default=None)
    ap.add_argument("--pad-first", type=int, default=None)
    ap.add_argument("--deliver", default="leaves", choices=["leaves", "tree"])
    ap.add_argument("--blobs", default=None)
    a = ap.parse_args()
    out = {"submitted": None}
    if a.submit:
        with open(a.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        out["submitted"] = submit(a.submit, rows, config={"rollout": {"n": 2}}, token=a.token)
    reader = Reader(a.url, prefix=a.prefix, blobs=a.blobs)
    groups, deadline = [], time.monotonic() + 60
    while True:
        if a.expect is not None and (len(groups) >= a.expect or time.monotonic() > deadline):
            break
        got = reader.groups(max=16, consumer="py-test", partition=a.partition, block_ms=500 if a.expect else 0, deliver=a.deliver)
        if not got and a.expect is None:
            break
        groups += got
    dumped = []
    for g in groups:
        recs = []
        for r in g.records:
            j = record_to_json(r)
            j["_bytes"] = {k: f"{r[k].dtype.str}:{r[k].tobytes().hex()}" for k in ARRAYS if isinstance(r[k], np.ndarray)}
            recs.append(j)
        d = {"uid": g.uid, "delivery_id": g.delivery_id, "n": g.n, "failed": g.failed, "partition": g.partition, "records": recs}
        if a.deliver == "tree":
            d["resolved"] = [record_to_json(r) for r in resolve_tree(g.records)]
        dumped.append(d)
    out["groups"] = dumped
    if a.pad_first is not None and groups:
        # Tree nodes are padded as the whole records they stand for (to_padded refuses nodes).
        first = [replace(groups[0], records=resolve_tree(groups[0].records))] if a.deliver == "tree" else groups[:1]
        p = to_padded(first, pad_token_id=a.pad_first)
        out["padded"] = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in p.items()}
        out["padded_dtypes"] = {k: v.dtype.str for k, v in p.items() if isinstance(v, np.ndarray)}
    out["acked"] = reader.ack(groups)
    out["after_ack"] = len(reader.groups(max=16, consumer="py-test", partition=a.partition, block_ms=0))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
