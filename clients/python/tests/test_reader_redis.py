"""Reader against a real Redis holding a hand-written layout (docs/queue-layout.md): delivery, ack, redelivery, healing.

Uses ``REDIS_URL`` (default ``redis://127.0.0.1:6379``) under a random key prefix, deleted afterwards.
Skipped when Redis is unreachable, unless ``CI`` is set (then it fails).
"""

import base64
import json
import os
import struct
import sys
import time
import unittest
import uuid

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from edgeloop import Group, LayoutError, Reader, to_padded  # noqa: E402

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")


def reachable():
    try:
        redis.Redis.from_url(URL, socket_connect_timeout=1).ping()
        return True
    except redis.RedisError:
        if os.environ.get("CI"):
            raise
        return False


def b64(fmt, values):
    return base64.b64encode(struct.pack("<" + fmt * len(values), *values))


@unittest.skipUnless(reachable(), f"Redis at {URL} is unreachable (and CI is not set)")
class ReaderRedisTest(unittest.TestCase):
    def setUp(self):
        self.p = f"test:pyreader:{uuid.uuid4().hex[:8]}:"
        self.r = redis.Redis.from_url(URL)

    def tearDown(self):
        keys = list(self.r.scan_iter(match=self.p + "*", count=1000))
        if keys:
            self.r.delete(*keys)
        self.r.close()

    def put(self, uid, sid, prompt, response, mask, logp=None, error=None, reward=1.0, out=0, role=None, **extra):
        key = f"{uid}_{sid}_{out}"
        meta = {"key": key, "uid": uid, "session_id": sid, "output_index": out, "agent_name": "a", "data_source": "d",
                "reward_score": reward, "num_turns": 2, "truncated": False, "finish_reason": "error" if error else "stop",
                "error": error, "metrics": {}, "extra_fields": {}}
        if role is not None:
            meta.update(agent_role=role, served_model=f"{role}-model")
        h = {"meta": json.dumps(meta), "prompt_ids": b64("i", prompt), "response_ids": b64("i", response),
             "response_mask": base64.b64encode(bytes(mask))}
        if logp is not None:
            h["rollout_log_probs"] = b64("f", logp)
        h.update(extra)
        self.r.hset(f"{self.p}traj:{key}", mapping=h)
        return key

    def complete(self, uid, keys, partition="train"):
        return self.r.xadd(f"{self.p}groups:{partition}", {"uid": uid, "n": len(keys), "failed": 0, "keys": json.dumps(keys)}).decode()

    def test_groups_ack_and_padding(self):
        k0 = self.put("g-1", 0, [1, 2], [3, 4], [1, 0], [-0.5, 0.0])
        k1 = self.put("g-1", 1, [1, 2], [5], [1], [-0.25], reward=0.0)
        eid = self.complete("g-1", [k0, k1])
        empty = self.complete("g-2", [])
        reader = Reader(URL, prefix=self.p)
        got = reader.groups(max=16, consumer="t0", block_ms=0)
        self.assertEqual([(g.uid, g.delivery_id, g.n, g.failed, g.partition) for g in got],
                         [("g-1", eid, 2, 0, "train"), ("g-2", empty, 0, 0, "train")])
        self.assertEqual([r["key"] for r in got[0].records], ["g-1_0_0", "g-1_1_0"])
        self.assertEqual(got[0].records[0]["rollout_log_probs"].tolist(), [-0.5, 0.0])
        self.assertEqual(got[1].records, [])
        batch = to_padded(got, pad_token_id=0)
        self.assertEqual(batch["input_ids"].tolist(), [[1, 2, 3, 4], [1, 2, 5, 0]])
        # Nothing new for this consumer; both pending until acked.
        self.assertEqual(reader.groups(consumer="t0", block_ms=0), [])
        self.assertEqual(self.r.xpending(f"{self.p}groups:train", "trainers")["pending"], 2)
        self.assertEqual(reader.ack(got), 2)
        self.assertEqual(reader.ack([eid]), 0)
        self.assertEqual(self.r.xpending(f"{self.p}groups:train", "trainers")["pending"], 0)

    def test_agent_role_filter_with_a_consumer_group_per_role(self):
        kp = self.put("r-1", 0, [1], [2], [1], role="planner")
        ks = self.put("r-1", 0, [1], [3], [1], out=1, role="solver")
        kn = self.put("r-1", 1, [1], [4], [1])
        eid = self.complete("r-1", [kp, ks, kn])
        planner = Reader(URL, prefix=self.p, group="planner-trainers")
        solver = Reader(URL, prefix=self.p, group="solver-trainers")
        p = planner.groups(consumer="p0", block_ms=0, agent_role="planner")
        s = solver.groups(consumer="s0", block_ms=0, agent_role="solver")
        self.assertEqual([(g.delivery_id, [r["key"] for r in g.records]) for g in p], [(eid, ["r-1_0_0"])])
        self.assertEqual([(g.delivery_id, [r["key"] for r in g.records]) for g in s], [(eid, ["r-1_0_1"])])
        self.assertEqual((p[0].records[0]["agent_role"], p[0].records[0]["served_model"]), ("planner", "planner-model"))
        self.assertEqual(s[0].records[0]["response_ids"].tolist(), [3])
        self.assertEqual((planner.ack(p), solver.ack(s)), (1, 1))
        with self.assertRaises(ValueError):
            planner.groups(consumer="p0", block_ms=0, agent_role="")

    def test_blocking_read_waits_then_returns_empty(self):
        reader = Reader(URL, prefix=self.p)
        t = time.monotonic()
        self.assertEqual(reader.groups(consumer="t0", block_ms=300), [])
        self.assertGreaterEqual(time.monotonic() - t, 0.25)

    def test_val_partition_and_failed_records(self):
        k = self.put("v-1", 0, [], [], [], error="engine: boom", reward=None)
        self.complete("v-1", [k], partition="val")
        reader = Reader(URL, prefix=self.p)
        self.assertEqual(reader.groups(consumer="t0", block_ms=0), [])
        got = reader.groups(consumer="t0", partition="val", block_ms=0)
        self.assertEqual((got[0].uid, got[0].failed, got[0].partition), ("v-1", 1, "val"))
        self.assertEqual(got[0].records[0]["error"], "engine: boom")
        self.assertEqual(reader.ack(got), 1)

    def test_unacked_groups_move_to_another_consumer_after_the_visibility_timeout(self):
        eid = self.complete("g-3", [self.put("g-3", 0, [1], [2], [1])])
        slow = Reader(URL, prefix=self.p, visibility_timeout_ms=100)
        self.assertEqual([g.delivery_id for g in slow.groups(consumer="dead", block_ms=0)], [eid])
        self.assertEqual(slow.groups(consumer="live", block_ms=0), [])
        time.sleep(0.2)
        again = slow.groups(consumer="live", block_ms=0)
        self.assertEqual([g.delivery_id for g in again], [eid])
        self.assertEqual(again[0].records[0]["response_ids"].tolist(), [2])

    def test_a_lost_consumer_group_is_created_again_and_redelivers(self):
        eid = self.complete("g-4", [self.put("g-4", 0, [1], [2], [1])])
        reader = Reader(URL, prefix=self.p)
        self.assertEqual([g.delivery_id for g in reader.groups(consumer="t0", block_ms=0)], [eid])
        self.r.xgroup_destroy(f"{self.p}groups:train", "trainers")
        self.assertEqual([g.delivery_id for g in reader.groups(consumer="t0", block_ms=0)], [eid])

    def test_side_channels_and_layout_errors(self):
        k = self.put("g-5", 0, [1], [2, 3], [1, 1], [-1.0, -2.0], teacher_log_probs=b64("f", [-0.5, -0.75]),
                     routed_experts=b64("i", [10, 11, 20, 21, 30, 31]), routed_experts_shape="[1, 2]")
        self.complete("g-5", [k])
        bad = self.r.xadd(f"{self.p}groups:train", {"uid": "g-6", "n": 1, "failed": 0, "keys": "not json"}).decode()
        reader = Reader(URL, prefix=self.p)
        with self.assertRaises(LayoutError) as cm:
            reader.groups(consumer="t0", block_ms=0)
        self.assertEqual((cm.exception.key, cm.exception.field), (bad, "keys"))
        reader.ack([bad])
        g = Reader(URL, prefix=self.p, visibility_timeout_ms=0).groups(consumer="t1", block_ms=0)
        self.assertIsInstance(g[0], Group)
        rec = g[0].records[0]
        self.assertEqual(rec["teacher_log_probs"].tolist(), [-0.5, -0.75])
        self.assertEqual(rec["routed_experts"].tolist(), [[[10, 11]], [[20, 21]], [[30, 31]]])


if __name__ == "__main__":
    unittest.main()
