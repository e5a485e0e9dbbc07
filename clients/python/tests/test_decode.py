"""decode_record on hand-built record hashes (docs/queue-layout.md, "Record hash"): exact values, dtypes, errors."""

import base64
import json
import os
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from edgeloop import LayoutError, decode_record, record_to_json  # noqa: E402

META = {"key": "q-1_2_0", "uid": "q-1", "session_id": 2, "output_index": 0, "agent_name": "tool_agent",
        "data_source": "t", "reward_score": 0.5, "num_turns": 3, "truncated": False, "finish_reason": "stop",
        "error": None, "metrics": {}, "extra_fields": {"model_versions": [1]}}


def b64(fmt, values):
    return base64.b64encode(struct.pack("<" + fmt * len(values), *values))


def stored(**extra):
    h = {
        b"meta": json.dumps(META).encode(),
        b"prompt_ids": b64("i", [151644, 872, 0, 2147483647]),
        b"response_ids": b64("i", [9, 8, 7]),
        b"response_mask": base64.b64encode(bytes([1, 0, 1])),
        b"rollout_log_probs": b64("f", [0.1, -0.0, -9999.0]),
    }
    h.update({k.encode(): v for k, v in extra.items()})
    return h


class DecodeTest(unittest.TestCase):
    def test_arrays_dtypes_and_float32_bits(self):
        r = decode_record(stored())
        self.assertEqual(r["prompt_ids"].dtype, np.int32)
        self.assertEqual(r["prompt_ids"].tolist(), [151644, 872, 0, 2147483647])
        self.assertEqual(r["response_ids"].tolist(), [9, 8, 7])
        self.assertEqual(r["response_mask"].dtype, np.uint8)
        self.assertEqual(r["response_mask"].tolist(), [1, 0, 1])
        lp = r["rollout_log_probs"]
        self.assertEqual(lp.dtype, np.float32)
        self.assertEqual(lp.tolist(), [0.10000000149011612, 0.0, -9999.0])
        self.assertEqual(lp.view(np.uint32).tolist(), [0x3DCCCCCD, 0x80000000, 0xC61C3C00])  # -0.0 keeps its sign
        self.assertTrue(lp.flags.writeable)
        self.assertIsNone(r["teacher_log_probs"])
        self.assertIsNone(r["routed_experts"])
        self.assertEqual(r["extra_fields"], {"model_versions": [1]})
        j = record_to_json(r)
        self.assertEqual(j["rollout_log_probs"], [0.10000000149011612, -0.0, -9999.0])
        self.assertEqual(json.loads(json.dumps(j))["prompt_ids"], [151644, 872, 0, 2147483647])

    def test_absent_log_probs_and_str_hashes(self):
        h = {k.decode(): v.decode() for k, v in stored().items() if k != b"rollout_log_probs"}
        self.assertIsNone(decode_record(h)["rollout_log_probs"])

    def test_teacher_log_probs_and_routed_experts(self):
        experts = [t * 10 + j for t in range(7) for j in range(4)]  # 7 tokens x 2 layers x top-2
        r = decode_record(stored(teacher_log_probs=b64("f", [-0.5, 0.0, -1.25]), routed_experts=b64("i", experts),
                                 routed_experts_shape=b"[2, 2]"))
        self.assertEqual(r["teacher_log_probs"].dtype, np.float32)
        self.assertEqual(r["teacher_log_probs"].tolist(), [-0.5, 0.0, -1.25])
        self.assertEqual(r["routed_experts"].dtype, np.int32)
        self.assertEqual(r["routed_experts"].shape, (7, 2, 2))
        self.assertEqual(r["routed_experts"][6].tolist(), [[60, 61], [62, 63]])

    def test_routed_experts_packed_widths(self):
        # The bytes the TypeScript writer stores (tests/store/routed-experts-pack.test.ts): 1 prompt + 2 response
        # tokens x 2 layers x top-2 of 8 experts = 12 bytes uint8, -1 as 0xff.
        experts = [0, 7, 3, 4, 5, -1, 1, 2, 6, 6, 0, 1]
        three = dict(prompt_ids=b64("i", [151644]), response_ids=b64("i", [9707, 151645]),
                     response_mask=base64.b64encode(bytes([1, 1])), rollout_log_probs=b64("f", [0.0, 0.0]),
                     routed_experts_shape=b"[2,2]")
        r = decode_record(stored(**three, routed_experts=b"AAcDBAX/AQIGBgAB", routed_experts_dtype=b"uint8"))
        self.assertEqual(len(base64.b64decode(b"AAcDBAX/AQIGBgAB")), 12)
        self.assertEqual(r["routed_experts"].dtype, np.int32)
        self.assertEqual(r["routed_experts"].shape, (3, 2, 2))
        self.assertEqual(r["routed_experts"].ravel().tolist(), experts)
        # The same values at every width, -1 surviving: uint16 (ids up to 65,534), int32 with and without the field.
        for top, fmt, dtype in ((255, "H", b"uint16"), (65534, "H", b"uint16"), (65535, "i", b"int32"), (65536, "i", None)):
            vals = [top] + experts[1:]
            raw = b64(fmt, [0xFFFF if (v == -1 and fmt == "H") else v for v in vals])
            extra = {} if dtype is None else {"routed_experts_dtype": dtype}
            got = decode_record(stored(**three, routed_experts=raw, **extra))["routed_experts"]
            self.assertEqual(got.dtype, np.int32)
            self.assertEqual(got.ravel().tolist(), vals, (top, dtype))
        # str hashes (decode_responses=True) read the same.
        h = {k.decode(): v.decode() for k, v in stored(**three, routed_experts=b"AAcDBAX/AQIGBgAB", routed_experts_dtype=b"uint8").items()}
        self.assertEqual(decode_record(h)["routed_experts"].ravel().tolist(), experts)

    def test_errors_name_key_and_field(self):
        cases = [
            ({b"meta": b"{"}, "field meta"),
            (stored(response_mask=base64.b64encode(bytes([1, 1]))), "response_mask has 2 entries, response_ids has 3 (key q-1_2_0, field response_mask)"),
            (stored(prompt_ids=base64.b64encode(b"abc")), "stored prompt_ids has 3 bytes, not a multiple of 4 (key q-1_2_0, field prompt_ids)"),
            (stored(response_ids=b"@@@"), "stored response_ids is not valid base64"),
            (stored(teacher_log_probs=b64("f", [1.0])), "teacher_log_probs has 1 entries, response_ids has 3"),
            (stored(routed_experts=b64("i", [1, 2])), "routed_experts_shape must be JSON [layers, top_k]"),
            (stored(routed_experts=b64("i", [1, 2]), routed_experts_shape=b"[2,1]"), "routed_experts has 2 values, not 7 tokens x 2 layers x 1 top_k"),
            (stored(routed_experts=b64("i", [1, 2]), routed_experts_shape=b"[2,1]", routed_experts_dtype=b"int8"),
             "routed_experts_dtype must be uint8, uint16 or int32, got 'int8' (key q-1_2_0, field routed_experts_dtype)"),
            (stored(routed_experts=base64.b64encode(b"abc"), routed_experts_shape=b"[1,1]", routed_experts_dtype=b"uint16"),
             "stored routed_experts has 3 bytes, not a multiple of 2"),
        ]
        for h, msg in cases:
            with self.assertRaises(LayoutError) as cm:
                decode_record(h)
            self.assertIn(msg, str(cm.exception))
        with self.assertRaisesRegex(LayoutError, r"no meta field \(key k_0_0, field meta\)"):
            decode_record({}, "k_0_0")


if __name__ == "__main__":
    unittest.main()
