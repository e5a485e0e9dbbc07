import { afterEach, describe, expect, test } from "bun:test";
import { InputError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { TransferQueue, TransferQueueOptions } from "../../shared/store/types.ts";
import { makeRecord, type ContractTarget } from "./contract.ts";

const le = (arr: Int32Array | Float32Array | Uint8Array) => Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength).toString("base64");

async function rejects(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected a rejection");
}

/**
 * `teacher_log_probs` (issue 16) through one transfer-queue adapter: stored as
 * base64 little-endian float32 (docs/queue-layout.md), read back as float32
 * values, absent (no field, no key) without a teacher — a record without it
 * stored byte for byte as before.
 */
export function teacherLogProbsContract(name: string, target: ContractTarget, prefixBase: string): void {
  describe(`teacher_log_probs: ${name}`, () => {
    let n = 0;
    const opened: TransferQueue[] = [];
    const open = (prefix: string, opts: TransferQueueOptions = {}) => {
      const q = target.open({ prefix, ...opts });
      opened.push(q);
      return q;
    };
    afterEach(async () => {
      for (const q of opened.splice(0)) await q.close();
    });

    test("stored as LE float32 beside rollout_log_probs, read back exactly, delivered with the group", async () => {
      const prefix = `${prefixBase}teacher${++n}:`;
      const q = open(prefix);
      await q.expectGroup("tch", 2);
      // 0.1 is not a float32: stored and returned as Math.fround(0.1)'s value; 0.0 under mask 0.
      const rec = makeRecord("tch", 0, { response_mask: [1, 0, 1], rollout_log_probs: [-0.5, 0, -0.125], teacher_log_probs: [-0.1, 0, -2.75] });
      const plain = makeRecord("tch", 1);
      await q.put(rec);
      await q.put(plain);
      const want = { ...rec, teacher_log_probs: [Math.fround(-0.1), 0, -2.75] };
      expect(await q.get("tch_0_0")).toEqual(want);
      expect((await q.get("tch_0_0"))!.teacher_log_probs![0]).toBe(-0.10000000149011612);
      const got = await q.get("tch_1_0");
      expect(got).toEqual(plain);
      expect("teacher_log_probs" in got!).toBe(false);
      const [g] = await q.readCompleteGroups({ consumer: "c", max: 1 });
      expect(g!.records.map((r) => r.teacher_log_probs ?? null)).toEqual([[Math.fround(-0.1), 0, -2.75], null]);
      // Field order is the schema's: teacher_log_probs right after rollout_log_probs (the JSONL's order too).
      expect(JSON.stringify(g!.records[0])).toBe(
        '{"key":"tch_0_0","uid":"tch","session_id":0,"output_index":0,"agent_name":"tool_agent","data_source":"gsm8k","prompt_ids":[151644,872,198,0],"response_ids":[9707,11,151645],"response_mask":[1,0,1],"rollout_log_probs":[-0.5,0,-0.125],"teacher_log_probs":[-0.10000000149011612,0,-2.75],"reward_score":1,"num_turns":2,"truncated":false,"finish_reason":"stop","error":null,"metrics":{"generate_sequences":0.5,"tool_calls":0,"compute_score":0.01,"num_preempted":-1},"extra_fields":{"model_versions":[3],"tool_rewards":[],"turn_scores":[]}}',
      );
      if (target.rawRecord) {
        const raw = await target.rawRecord(prefix, "tch_0_0");
        expect(Object.keys(raw).sort()).toEqual(["meta", "prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "teacher_log_probs"]);
        expect(raw.teacher_log_probs).toBe(le(Float32Array.from([-0.1, 0, -2.75])));
        expect(raw.teacher_log_probs).toBe("zczMvQAAAAAAADDA");
        expect(JSON.parse(raw.meta!)).not.toHaveProperty("teacher_log_probs");
      }
    });

    test("a record without teacher log-probs is stored byte for byte as before (exact HGETALL)", async () => {
      if (!target.rawRecord) return;
      const prefix = `${prefixBase}teacher${++n}:`;
      const q = open(prefix);
      await q.put(makeRecord("plain", 0));
      expect(await target.rawRecord(prefix, "plain_0_0")).toEqual({
        meta: '{"key":"plain_0_0","uid":"plain","session_id":0,"output_index":0,"agent_name":"tool_agent","data_source":"gsm8k","reward_score":1,"num_turns":2,"truncated":false,"finish_reason":"stop","error":null,"metrics":{"generate_sequences":0.5,"tool_calls":0,"compute_score":0.01,"num_preempted":-1},"extra_fields":{"model_versions":[3],"tool_rewards":[],"turn_scores":[]}}',
        prompt_ids: "XFACAGgDAADGAAAAAAAAAA==",
        response_ids: "6yUAAAsAAABdUAIA",
        response_mask: "AQEB",
        rollout_log_probs: "AAAAvwAAgL4AAAC+",
      });
    });

    test("bad teacher log-probs are refused naming the field", async () => {
      const q = open(`${prefixBase}teacher${++n}:`);
      const check = async (over: Partial<TrajectoryRecord>, field: string, msg: RegExp) => {
        const e = await rejects(q.put(makeRecord("bad", 0, over)));
        expect(e).toBeInstanceOf(InputError);
        expect((e as InputError).field).toBe(field);
        expect((e as InputError).message).toMatch(msg);
      };
      await check({ teacher_log_probs: [-1, -2] }, "record.teacher_log_probs", /^record\.teacher_log_probs: has 2 entries, response_ids has 3$/);
      await check({ teacher_log_probs: [-1, Number.NaN, -2] }, "record.teacher_log_probs[1]", /must be a finite number, got NaN/);
      await check({ teacher_log_probs: null as unknown as number[] }, "record.teacher_log_probs", /expected an array/);
      expect(await q.get("bad_0_0")).toBeNull();
    });
  });
}
