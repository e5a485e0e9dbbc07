"""Python side of bench/python-reader.ts: read throughput of the edgeloop package vs raw redis-py.

Usage: python3 bench/python-reader.py --url URL --prefix P --groups G [--repeats 3] [--experts-records 16]
Prints one JSON object with the timings (seconds) and counts. Reads only; the caller writes and cleans up.
"""

import argparse
import base64
import json
import os
import statistics
import sys
import time

import numpy as np
import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from edgeloop import Reader, decode_record, to_padded  # noqa: E402


def read_edgeloop(url, prefix, group, expect):
    reader = Reader(url, prefix=prefix, group=group)
    t = time.perf_counter()
    groups, tokens = [], 0
    while len(groups) < expect:
        got = reader.groups(max=16, consumer="bench", block_ms=0)
        if not got:
            break
        groups += got
    dt = time.perf_counter() - t
    for g in groups:
        for r in g.records:
            tokens += r["prompt_ids"].shape[0] + r["response_ids"].shape[0]
    reader.close()
    return dt, groups, tokens


def read_raw(url, prefix, group, expect):
    """The same commands as the reader (XREADGROUP COUNT 16, one pipeline of HGETALL per read), no decoding."""
    r = redis.Redis.from_url(url)
    stream = f"{prefix}groups:train"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    t = time.perf_counter()
    n, nbytes = 0, 0
    while n < expect:
        res = r.xreadgroup(group, "bench", {stream: ">"}, count=16)
        if not res:
            break
        pipe = r.pipeline(transaction=False)
        for _s, entries in res:
            for _id, f in entries:
                for k in json.loads(f[b"keys"]):
                    pipe.hgetall(f"{prefix}traj:{k}")
                n += 1
        for h in pipe.execute():
            nbytes += sum(len(v) for v in h.values())
    dt = time.perf_counter() - t
    r.close()
    return dt, nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--groups", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--experts-records", type=int, default=16)
    a = ap.parse_args()
    out = {"python": sys.version.split()[0], "redis_py": redis.__version__, "numpy": np.__version__}
    el, raw = [], []
    for i in range(a.repeats):
        dt, groups, tokens = read_edgeloop(a.url, a.prefix, f"bench-el-{i}", a.groups)
        el.append(dt)
        rdt, nbytes = read_raw(a.url, a.prefix, f"bench-raw-{i}", a.groups)
        raw.append(rdt)
    records = [r for g in groups for r in g.records]
    out.update(groups=len(groups), records=len(records), tokens=tokens, stored_bytes=nbytes,
               edgeloop_s=statistics.median(el), raw_s=statistics.median(raw))
    # Decode alone (base64 -> numpy) on hashes already in memory, and padding a 64-record batch.
    r = redis.Redis.from_url(a.url)
    hashes = [r.hgetall(f"{a.prefix}traj:{x['key']}") for x in records[:256]]
    t = time.perf_counter()
    for h in hashes:
        decode_record(h)
    out["decode_s_per_record"] = (time.perf_counter() - t) / len(hashes)
    t = time.perf_counter()
    batch = to_padded(groups[:8], pad_token_id=0)
    out["pad_64_s"] = time.perf_counter() - t
    out["pad_64_shape"] = list(batch["input_ids"].shape)
    # Routed experts (48 layers x top-8, int32) on a few records: their decode cost and stored size.
    L, K = 48, 8
    rng = np.random.default_rng(0)
    ex = []
    for x in records[: a.experts_records]:
        tok = x["prompt_ids"].shape[0] + x["response_ids"].shape[0]
        h = dict(r.hgetall(f"{a.prefix}traj:{x['key']}"))
        h[b"routed_experts"] = base64.b64encode(rng.integers(0, 128, size=(tok, L, K), dtype=np.int32).astype("<i4").tobytes())
        h[b"routed_experts_shape"] = json.dumps([L, K]).encode()
        ex.append((tok, h))
    t = time.perf_counter()
    for _tok, h in ex:
        decode_record(h)
    dt = time.perf_counter() - t
    out["experts"] = {"records": len(ex), "layers": L, "top_k": K, "decode_s_per_record": dt / max(len(ex), 1),
                      "tokens_per_s": sum(tok for tok, _ in ex) / dt if dt else None,
                      "stored_bytes_per_token": sum(len(h[b"routed_experts"]) for _t, h in ex) / sum(tok for tok, _ in ex)}
    r.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
