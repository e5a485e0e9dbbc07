"""to_padded against a hand-computed batch (verl's agent-loop padding: left-padded prompts, right-padded responses)."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from edgeloop import Group, to_padded  # noqa: E402


def rec(key, prompt, response, mask, logp=None, reward=None, error=None, teacher=None, experts=None):
    uid = key.split("_")[0]
    return {
        "key": key, "uid": uid, "session_id": int(key.split("_")[1]), "output_index": 0,
        "reward_score": reward, "error": error,
        "prompt_ids": np.array(prompt, dtype=np.int32),
        "response_ids": np.array(response, dtype=np.int32),
        "response_mask": np.array(mask, dtype=np.uint8),
        "rollout_log_probs": None if logp is None else np.array(logp, dtype=np.float32),
        "teacher_log_probs": None if teacher is None else np.array(teacher, dtype=np.float32),
        "routed_experts": None if experts is None else np.array(experts, dtype=np.int32),
    }


A = rec("g1_0_0", [11, 12, 13], [21, 22, 23, 24], [1, 1, 0, 1], [-0.5, -0.25, 0.0, -1.0], reward=1.0,
        teacher=[-0.75, -0.5, 0.0, -2.0], experts=[[[t], [100 + t]] for t in range(7)])
B = rec("g1_1_0", [31], [41, 42], [1, 1], [-0.125, -2.0], reward=0.5,
        teacher=[-1.5, -0.25], experts=[[[200 + t], [300 + t]] for t in range(3)])


class PaddingTest(unittest.TestCase):
    def test_hand_computed_batch(self):
        g = Group(uid="g1", partition="train", delivery_id="1-0", n=2, failed=0, records=[A, B])
        out = to_padded([g], pad_token_id=0, prompt_length=4, response_length=5)
        eq = np.testing.assert_array_equal
        eq(out["prompts"], [[0, 11, 12, 13], [0, 0, 0, 31]])
        eq(out["responses"], [[21, 22, 23, 24, 0], [41, 42, 0, 0, 0]])
        eq(out["input_ids"], [[0, 11, 12, 13, 21, 22, 23, 24, 0], [0, 0, 0, 31, 41, 42, 0, 0, 0]])
        eq(out["attention_mask"], [[0, 1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0]])
        # clip(cumsum(mask) - 1, 0): left pads at 0, right pads repeat the last position.
        eq(out["position_ids"], [[0, 0, 1, 2, 3, 4, 5, 6, 6], [0, 0, 0, 0, 1, 2, 2, 2, 2]])
        eq(out["response_mask"], [[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]])
        eq(out["rollout_log_probs"], np.array([[-0.5, -0.25, 0, -1, 0], [-0.125, -2, 0, 0, 0]], dtype=np.float32))
        eq(out["teacher_log_probs"], np.array([[-0.75, -0.5, 0, -2, 0], [-1.5, -0.25, 0, 0, 0]], dtype=np.float32))
        eq(out["rewards"], np.array([1.0, 0.5], dtype=np.float32))
        eq(out["rm_scores"], np.array([[0, 0, 0, 1, 0], [0, 0.5, 0, 0, 0]], dtype=np.float32))
        experts = out["routed_experts"]
        self.assertEqual(experts.shape, (2, 9, 2, 1))
        eq(experts[0, :, 0, 0], [0, 0, 1, 2, 3, 4, 5, 6, 0])
        eq(experts[0, :, 1, 0], [0, 100, 101, 102, 103, 104, 105, 106, 0])
        eq(experts[1, :, 0, 0], [0, 0, 0, 200, 201, 202, 0, 0, 0])
        eq(experts[1, :, 1, 0], [0, 0, 0, 300, 301, 302, 0, 0, 0])
        self.assertEqual(list(out["uid"]), ["g1", "g1"])
        self.assertEqual(list(out["key"]), ["g1_0_0", "g1_1_0"])
        for k in ("input_ids", "prompts", "responses", "attention_mask", "position_ids", "response_mask"):
            self.assertEqual(out[k].dtype, np.int64, k)
        for k in ("rollout_log_probs", "teacher_log_probs", "rewards", "rm_scores"):
            self.assertEqual(out[k].dtype, np.float32, k)
        self.assertEqual(experts.dtype, np.int32)

    def test_default_lengths_are_the_longest_and_absent_arrays_are_none(self):
        a = rec("u_0_0", [5, 6], [7], [1])
        b = rec("u_1_0", [8], [9, 10, 11], [1, 0, 1], reward=None)
        out = to_padded([a, b], pad_token_id=151643)
        np.testing.assert_array_equal(out["input_ids"], [[5, 6, 7, 151643, 151643], [151643, 8, 9, 10, 11]])
        np.testing.assert_array_equal(out["position_ids"], [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3]])
        self.assertIsNone(out["rollout_log_probs"])
        self.assertIsNone(out["teacher_log_probs"])
        self.assertIsNone(out["routed_experts"])
        self.assertTrue(np.isnan(out["rewards"]).all())
        self.assertFalse(out["rm_scores"].any())

    def test_failed_records_are_left_out_unless_asked(self):
        bad = rec("u_1_0", [], [], [], error="engine: boom")
        out = to_padded([rec("u_0_0", [1], [2], [1]), bad], pad_token_id=0)
        self.assertEqual(out["input_ids"].shape, (1, 2))
        self.assertEqual(to_padded([bad], pad_token_id=0, include_failed=True)["input_ids"].shape, (1, 0))
        empty = to_padded([], pad_token_id=0, prompt_length=3, response_length=2)
        self.assertEqual(empty["input_ids"].shape, (0, 5))

    def test_dropped_failed_records_are_counted_logged_and_group_sizes_reported(self):
        # A group of 4 with 1 failed record (the operator trial's N7) and a complete group of 2.
        g4 = Group(uid="u", partition="train", delivery_id="1-0", n=4, failed=1, records=[
            rec("u_0_0", [1], [2], [1], reward=1.0), rec("u_1_0", [], [], [], error="engine: boom"),
            rec("u_2_0", [1], [3], [1], reward=0.0), rec("u_3_0", [1], [4], [1], reward=1.0)])
        g2 = Group(uid="w", partition="train", delivery_id="2-0", n=2, failed=0, records=[
            rec("w_0_0", [5], [6], [1], reward=0.5), rec("w_1_0", [5], [7], [1], reward=0.25)])
        with self.assertLogs("edgeloop", level="WARNING") as logs:
            out = to_padded([g4, g2], pad_token_id=0)
        self.assertEqual(logs.output, ["WARNING:edgeloop:to_padded dropped 1 failed record(s) (include_failed=False): u_1_0"])
        self.assertEqual(list(out["key"]), ["u_0_0", "u_2_0", "u_3_0", "w_0_0", "w_1_0"])
        self.assertEqual(out["dropped"], 1)
        self.assertEqual(out["dropped_keys"], ["u_1_0"])
        self.assertEqual(out["group_n"].dtype, np.int64)
        np.testing.assert_array_equal(out["group_n"], [4, 4, 4, 2, 2])
        np.testing.assert_array_equal(out["group_kept"], [3, 3, 3, 2, 2])
        # The GRPO baseline of group u averages the 3 kept rewards: (1 + 0 + 1) / 3.
        u = out["uid"] == "u"
        self.assertEqual(float(out["rewards"][u].sum() / out["group_kept"][u][0]), 2.0 / 3.0)

        kept_all = to_padded([g4, g2], pad_token_id=0, include_failed=True)
        self.assertEqual((kept_all["dropped"], kept_all["dropped_keys"]), (0, []))
        np.testing.assert_array_equal(kept_all["group_n"], [4, 4, 4, 4, 2, 2])
        np.testing.assert_array_equal(kept_all["group_kept"], [4, 4, 4, 4, 2, 2])

        # Bare record dicts: a group is the records of one uid passed in.
        loose = to_padded([rec("u_0_0", [1], [2], [1]), rec("u_1_0", [], [], [], error="x"), rec("v_0_0", [1], [2], [1])], pad_token_id=0)
        self.assertEqual(list(loose["key"]), ["u_0_0", "v_0_0"])
        np.testing.assert_array_equal(loose["group_n"], [2, 1])
        np.testing.assert_array_equal(loose["group_kept"], [1, 1])
        self.assertEqual(loose["dropped_keys"], ["u_1_0"])

    def test_nothing_is_logged_when_nothing_is_dropped(self):
        with self.assertNoLogs("edgeloop", level="WARNING"):
            out = to_padded([rec("u_0_0", [1], [2], [1], reward=0.0)], pad_token_id=0)
        self.assertEqual(out["dropped"], 0)

    def test_records_without_a_reward_are_named_and_pad_to_nan(self):
        # An abandoned gateway session's record has reward_score None: its reward is NaN, and the keys are logged once.
        recs = [rec("u_0_0", [1], [2], [1], reward=1.0), rec("u_1_0", [1], [3], [1]), rec("u_2_0", [1], [4], [1])]
        with self.assertLogs("edgeloop", level="WARNING") as logs:
            out = to_padded(recs, pad_token_id=0)
        self.assertEqual(len(logs.output), 1)
        self.assertIn("2 record(s) have no reward_score", logs.output[0])
        self.assertTrue(logs.output[0].endswith(": u_1_0, u_2_0"))
        np.testing.assert_array_equal(np.isnan(out["rewards"]), [False, True, True])
        np.testing.assert_array_equal(out["rm_scores"][1:], np.zeros((2, 1), dtype=np.float32))

    def test_a_record_without_routed_experts_gets_the_fill_value(self):
        # A trajectory that made no engine call (e.g. its first call overflowed the context) has no routed experts.
        none = rec("g1_2_0", [51, 52], [], [], [], reward=0.0, teacher=[])
        out = to_padded([A, B, none], pad_token_id=0, prompt_length=4, response_length=5)
        eq = np.testing.assert_array_equal
        self.assertEqual(out["routed_experts"].shape, (3, 9, 2, 1))
        eq(out["routed_experts"][2], np.zeros((9, 2, 1), dtype=np.int32))
        eq(out["routed_experts"][1, 3:6, :, 0], [[200, 300], [201, 301], [202, 302]])
        self.assertIsNone(to_padded([none], pad_token_id=0)["routed_experts"])

    def test_refusals_name_the_record(self):
        with self.assertRaisesRegex(ValueError, r"record g1_0_0 has 4 response tokens, more than response_length=3"):
            to_padded([A, B], pad_token_id=0, response_length=3)
        with self.assertRaisesRegex(ValueError, r"record g1_0_0 has 3 prompt tokens, more than prompt_length=2"):
            to_padded([A], pad_token_id=0, prompt_length=2)
        no_lp = rec("g1_2_0", [1], [2], [1])
        with self.assertRaisesRegex(ValueError, r"rollout_log_probs is present on some records but not on g1_2_0"):
            to_padded([A, no_lp], pad_token_id=0)

    def test_records_of_two_models_are_refused(self):
        qwen = {"name": "qwen3", "fingerprint": "d90f4c60ab225f77"}
        llama = {"name": "llama3_1", "fingerprint": "a46dd04db0e482fa"}
        a = dict(rec("m_0_0", [1], [2], [1]), model=qwen)
        b = dict(rec("m_1_0", [3], [4], [1]), model=llama)
        self.assertEqual(to_padded([a, rec("m_2_0", [5], [6], [1])], pad_token_id=0)["model"], qwen)
        self.assertIsNone(to_padded([rec("m_2_0", [5], [6], [1])], pad_token_id=0)["model"])
        with self.assertRaisesRegex(ValueError, r"records m_0_0 and m_1_0 hold token ids of two models \(qwen3 d90f4c60ab225f77, llama3_1 a46dd04db0e482fa\)"):
            to_padded([a, b], pad_token_id=0)


if __name__ == "__main__":
    unittest.main()
