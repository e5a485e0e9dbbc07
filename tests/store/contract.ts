import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { ConflictError, InputError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { CompleteGroup, TransferQueue, TransferQueueOptions } from "../../shared/store/types.ts";
import { treeNodesOf, treeRecords } from "../helpers/tree-records.ts";

/** One adapter under the contract. */
export interface ContractTarget {
  /** Opens a queue on the test's storage (`opts.prefix` is fresh per test). */
  open(opts: TransferQueueOptions): TransferQueue;
  /** True when two queues opened with one prefix see the same data (Redis); false for memory. */
  sharesState: boolean;
  /** The raw stored hash of `key` under `prefix` (Redis adapters), for byte-level checks. */
  rawRecord?(prefix: string, key: string): Promise<Record<string, string>>;
  /** Every Redis key under `prefix` with its TTL in ms (-1 = none) (Redis adapters). */
  rawKeys?(prefix: string): Promise<Record<string, number>>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A valid record for `uid`/`session_id` with small distinctive arrays. */
export function makeRecord(uid: string, session_id: number, over: Partial<TrajectoryRecord> = {}): TrajectoryRecord {
  return {
    key: `${uid}_${session_id}_0`,
    uid,
    session_id,
    output_index: 0,
    agent_name: "tool_agent",
    data_source: "gsm8k",
    prompt_ids: [151644, 872, 198, session_id],
    response_ids: [9707, 11, 151645],
    response_mask: [1, 1, 1],
    rollout_log_probs: [-0.5, -0.25, -0.125],
    reward_score: 1,
    num_turns: 2,
    truncated: false,
    finish_reason: "stop",
    error: null,
    metrics: { generate_sequences: 0.5, tool_calls: 0, compute_score: 0.01, num_preempted: -1 },
    extra_fields: { model_versions: [3], tool_rewards: [], turn_scores: [] },
    ...over,
  };
}

async function rejects(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected a rejection");
}

/** Runs the transfer-queue contract against one adapter. */
export function transferQueueContract(name: string, target: ContractTarget, prefixBase: string): void {
  describe(`TransferQueue contract: ${name}`, () => {
    let n = 0;
    let prefix = "";
    const opened: TransferQueue[] = [];
    const open = (opts: TransferQueueOptions = {}) => {
      const q = target.open({ prefix, ...opts });
      opened.push(q);
      return q;
    };
    beforeEach(() => {
      prefix = `${prefixBase}${++n}:`;
    });
    afterEach(async () => {
      await Promise.all(opened.splice(0).map((q) => q.close()));
    });

    test("put is idempotent per key: the second write stores nothing and says so", async () => {
      const q = open();
      const r = makeRecord("u1", 0);
      expect(await q.put(r)).toEqual({ key: "u1_0_0", stored: true });
      expect(await q.put({ ...r, response_ids: [1, 2, 3], reward_score: 0 })).toEqual({ key: "u1_0_0", stored: false });
      expect(await q.get("u1_0_0")).toEqual(r);
      expect(await q.get("u1_1_0")).toBeNull();
      expect(await q.groupStatus("u1")).toEqual({ uid: "u1", partition: "train", expected: null, finished: 1, records: 1, failed: 0, complete: false, fingerprint: null });
    });

    test("a group with a failed member completes, flagged, and is delivered with every record", async () => {
      const q = open();
      await q.expectGroup("g1", 3);
      await q.expectGroup("g1", 3);
      await q.put(makeRecord("g1", 1));
      await q.put(makeRecord("g1", 0));
      expect(await q.groupStatus("g1")).toEqual({ uid: "g1", partition: "train", expected: 3, finished: 2, records: 2, failed: 0, complete: false, fingerprint: null });
      expect(await q.readCompleteGroups({ consumer: "c1", max: 10 })).toEqual([]);
      expect(await q.markFailed("g1_2_0", "engine unavailable", { agent_name: "tool_agent" })).toEqual({ key: "g1_2_0", stored: true });
      expect(await q.markFailed("g1_2_0", "again")).toEqual({ key: "g1_2_0", stored: false });
      expect(await q.markFailed("g1_0_0", "late")).toEqual({ key: "g1_0_0", stored: false });
      expect(await q.groupStatus("g1")).toEqual({ uid: "g1", partition: "train", expected: 3, finished: 3, records: 3, failed: 1, complete: true, fingerprint: null });
      const got = await q.readCompleteGroups({ consumer: "c1", max: 10 });
      expect(got.length).toBe(1);
      expect(got[0]!.uid).toBe("g1");
      expect(got[0]!.partition).toBe("train");
      expect(got[0]!.failed).toBe(1);
      expect(got[0]!.records.map((r) => r.key)).toEqual(["g1_0_0", "g1_1_0", "g1_2_0"]);
      expect(got[0]!.records[0]).toEqual(makeRecord("g1", 0));
      const failed = got[0]!.records[2]!;
      expect(failed.error).toBe("engine unavailable");
      expect(failed.finish_reason).toBe("error");
      expect(failed.agent_name).toBe("tool_agent");
      expect(failed.response_ids).toEqual([]);
      expect(failed.rollout_log_probs).toBeNull();
      expect(await q.ack([got[0]!.delivery_id])).toBe(1);
    });

    test("E1: a group counts sessions, not records: delivered once, after its last session finished, with every output", async () => {
      const q = open();
      await q.expectGroup("multi0", 2);
      const out = (sid: number, o: number) => makeRecord("multi0", sid, { key: `multi0_${sid}_${o}`, output_index: o, response_ids: [9707, o, 151645] });
      expect(await q.put(out(0, 0), { last: false })).toEqual({ key: "multi0_0_0", stored: true });
      expect(await q.put(out(0, 1))).toEqual({ key: "multi0_0_1", stored: true });
      expect(await q.put(out(1, 0), { last: false })).toEqual({ key: "multi0_1_0", stored: true });
      // 3 records, 1 session finished: the old record count (3 >= 2) would have delivered session 0 alone.
      expect(await q.groupStatus("multi0")).toEqual({ uid: "multi0", partition: "train", expected: 2, finished: 1, records: 3, failed: 0, complete: false, fingerprint: null });
      expect(await q.readCompleteGroups({ consumer: "c", max: 5 })).toEqual([]);
      expect(await q.sessionRecords("multi0", 0)).toEqual([out(0, 0), out(0, 1)]);
      expect(await q.sessionRecords("multi0", 1)).toBeNull();
      expect(await q.put(out(1, 1))).toEqual({ key: "multi0_1_1", stored: true });
      expect(await q.put(out(1, 1))).toEqual({ key: "multi0_1_1", stored: false });
      expect(await q.groupStatus("multi0")).toEqual({ uid: "multi0", partition: "train", expected: 2, finished: 2, records: 4, failed: 0, complete: true, fingerprint: null });
      const got = await q.readCompleteGroups({ consumer: "c", max: 5 });
      expect(got.map((g) => [g.uid, g.failed, g.records.map((r) => r.key)])).toEqual([["multi0", 0, ["multi0_0_0", "multi0_0_1", "multi0_1_0", "multi0_1_1"]]]);
      expect(got[0]!.records).toEqual([out(0, 0), out(0, 1), out(1, 0), out(1, 1)]);
      expect(await q.readCompleteGroups({ consumer: "c2", max: 5 })).toEqual([]);
    });

    test("sessions of 3, 1 and 0 outputs: outputs in any order, the empty session finished explicitly", async () => {
      const q = open();
      await q.expectGroup("mix", 3);
      const out = (sid: number, o: number) => makeRecord("mix", sid, { key: `mix_${sid}_${o}`, output_index: o });
      // Order-independent: the last output may land first; the session finishes when 0..2 are all in.
      await q.put(out(0, 2));
      await q.put(out(0, 0), { last: false });
      expect((await q.groupStatus("mix")).finished).toBe(0);
      await q.put(out(1, 0));
      expect(await q.finishSession("mix", 2, 0)).toBe(true);
      expect(await q.finishSession("mix", 2, 0)).toBe(false);
      expect(await q.sessionRecords("mix", 2)).toEqual([]);
      expect(await q.groupStatus("mix")).toMatchObject({ finished: 2, records: 3, complete: false });
      expect(await q.readCompleteGroups({ consumer: "c", max: 5 })).toEqual([]);
      await q.put(out(0, 1), { last: false });
      expect(await q.groupStatus("mix")).toMatchObject({ expected: 3, finished: 3, records: 4, complete: true });
      const [g] = await q.readCompleteGroups({ consumer: "c", max: 5 });
      expect(g!.records.map((r) => r.key)).toEqual(["mix_0_0", "mix_0_1", "mix_0_2", "mix_1_0"]);
      expect(await q.sessionRecords("mix", 0)).toEqual([out(0, 0), out(0, 1), out(0, 2)]);
    });

    test("a group whose sessions emitted nothing completes and is delivered once, with no records", async () => {
      const q = open();
      await q.expectGroup("none", 2);
      expect(await q.finishSession("none", 1, 0)).toBe(true);
      expect(await q.readCompleteGroups({ consumer: "c", max: 5 })).toEqual([]);
      expect(await q.finishSession("none", 0, 0)).toBe(true);
      expect(await q.groupStatus("none")).toEqual({ uid: "none", partition: "train", expected: 2, finished: 2, records: 0, failed: 0, complete: true, fingerprint: null });
      const got = await q.readCompleteGroups({ consumer: "c", max: 5 });
      expect(got.map((g) => [g.uid, g.failed, g.records])).toEqual([["none", 0, []]]);
      expect(await q.readCompleteGroups({ consumer: "c", max: 5 })).toEqual([]);
    });

    test.skipIf(!target.rawKeys)("puts leave no staging hash behind; stored records never expire", async () => {
      const q = open();
      await q.expectGroup("st", 2);
      await q.put(makeRecord("st", 0));
      await q.put(makeRecord("st", 0));
      await rejects(q.put(makeRecord("st", 0, { key: "st_0_1", output_index: 1 })));
      await q.put(makeRecord("st", 1, { key: "st_1_1", output_index: 1 }), { last: false });
      await q.markFailed("st_1_0", "x");
      const keys = await target.rawKeys!(prefix);
      expect(Object.keys(keys).map((k) => k.slice(prefix.length)).sort()).toEqual(["group:st", "group:st:keys", "groups:train", "traj:st_0_0", "traj:st_1_0", "traj:st_1_1"]);
      expect(Object.values(keys)).toEqual([-1, -1, -1, -1, -1, -1]);
    });

    test("a write contradicting a session's output count is a ConflictError and stores nothing", async () => {
      const q = open();
      await q.expectGroup("cx", 2);
      const out = (sid: number, o: number) => makeRecord("cx", sid, { key: `cx_${sid}_${o}`, output_index: o });
      await q.put(out(0, 0));
      const past = await rejects(q.put(out(0, 1)));
      expect(past).toBeInstanceOf(ConflictError);
      expect([(past as ConflictError).status, (past as ConflictError).message]).toEqual([409, "session cx_0 finished with 1 outputs; output_index 1 is past its last"]);
      expect(await q.get("cx_0_1")).toBeNull();
      await q.put(out(1, 1), { last: false });
      const below = await rejects(q.put(out(1, 0)));
      expect((below as ConflictError).message).toBe("session cx_1 has 1 outputs stored; output 0 cannot be its last");
      expect((await rejects(q.finishSession("cx", 0, 2)) as ConflictError).message).toBe("session cx_0 finished with 1 outputs, not 2");
      expect((await rejects(q.finishSession("cx", 1, 0)) as ConflictError).message).toBe("session cx_1 has 1 outputs stored, more than 0");
      expect(await q.groupStatus("cx")).toMatchObject({ finished: 1, records: 2, complete: false });
      // finishSession after non-last puts: the declared count closes the session.
      expect(await q.finishSession("cx", 1, 2)).toBe(false);
      await q.put(out(1, 0), { last: false });
      expect(await q.groupStatus("cx")).toMatchObject({ finished: 2, records: 3, complete: true });
    });

    test("markFailed finishes its session with the outputs it stored, also on an already-stored key", async () => {
      const q = open();
      await q.expectGroup("mf", 3);
      const out = (sid: number, o: number) => makeRecord("mf", sid, { key: `mf_${sid}_${o}`, output_index: o });
      await q.put(out(0, 0), { last: false });
      // The session's writer gave up after its first output (a worker delivered too often): markFailed on a stored key.
      expect(await q.markFailed("mf_0_0", "job failed")).toEqual({ key: "mf_0_0", stored: false });
      expect(await q.sessionRecords("mf", 0)).toEqual([out(0, 0)]);
      // A session that failed after one output records the failure as its next output.
      await q.put(out(1, 0), { last: false });
      expect(await q.markFailed("mf_1_1", "engine down")).toEqual({ key: "mf_1_1", stored: true });
      // A failure reported after the session finished changes nothing.
      await q.put(out(2, 0));
      expect(await q.markFailed("mf_2_1", "late")).toEqual({ key: "mf_2_1", stored: false });
      expect(await q.get("mf_2_1")).toBeNull();
      expect(await q.groupStatus("mf")).toEqual({ uid: "mf", partition: "train", expected: 3, finished: 3, records: 4, failed: 1, complete: true, fingerprint: null });
      const [g] = await q.readCompleteGroups({ consumer: "c", max: 5 });
      expect([g!.failed, g!.records.map((r) => [r.key, r.error])]).toEqual([1, [["mf_0_0", null], ["mf_1_0", null], ["mf_1_1", "engine down"], ["mf_2_0", null]]]);
    });

    test("E9: a uid names one prompt group: another fingerprint is a 409 naming the uid, the same one is idempotent", async () => {
      const q = open();
      const fp = "a".repeat(64);
      await q.expectGroup("reuse1", 1, "train", fp);
      await q.expectGroup("reuse1", 1, "train", fp);
      await q.expectGroup("reuse1", 1, "train");
      const e = await rejects(q.expectGroup("reuse1", 1, "train", "b".repeat(64)));
      expect(e).toBeInstanceOf(ConflictError);
      expect([(e as ConflictError).status, (e as ConflictError).field, (e as ConflictError).message]).toEqual([409, "uid", "uid 'reuse1' names another prompt group: a uid names one prompt group; use a new uid for new samples"]);
      expect((await q.groupStatus("reuse1")).fingerprint).toBe(fp);
      // A group registered without one takes the first fingerprint given.
      await q.expectGroup("nofp", 1);
      await q.expectGroup("nofp", 1, "train", fp);
      expect((await q.groupStatus("nofp")).fingerprint).toBe(fp);
    });

    test("registering after the puts completes the group; another n or partition conflicts", async () => {
      const q = open();
      await q.put(makeRecord("late", 0));
      await q.put(makeRecord("late", 1));
      expect((await q.groupStatus("late")).complete).toBe(false);
      await q.expectGroup("late", 2);
      expect((await q.groupStatus("late")).complete).toBe(true);
      expect(await rejects(q.expectGroup("late", 3))).toBeInstanceOf(ConflictError);
      expect(await rejects(q.expectGroup("late", 2, "val"))).toBeInstanceOf(ConflictError);
      const got = await q.readCompleteGroups({ consumer: "c", max: 5 });
      expect(got.map((g) => [g.uid, g.records.length])).toEqual([["late", 2]]);
    });

    test("two concurrent consumers receive each group exactly once; acked groups never come back", async () => {
      const a = open();
      const b = target.sharesState ? open() : a;
      const uids = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"];
      for (const uid of uids) {
        await a.expectGroup(uid, 2);
        await Promise.all([a.put(makeRecord(uid, 0)), b.put(makeRecord(uid, 1))]);
      }
      const seen: Record<string, string[]> = { A: [], B: [] };
      const ids: Record<string, string[]> = { A: [], B: [] };
      const consume = async (q: TransferQueue, who: "A" | "B") => {
        for (;;) {
          const got: CompleteGroup[] = await q.readCompleteGroups({ consumer: who, max: 3 });
          if (got.length === 0) return;
          for (const g of got) {
            seen[who]!.push(g.uid);
            ids[who]!.push(g.delivery_id);
            expect(g.records.map((r) => r.key)).toEqual([`${g.uid}_0_0`, `${g.uid}_1_0`]);
          }
        }
      };
      await Promise.all([consume(a, "A"), consume(b, "B")]);
      expect([...seen.A!, ...seen.B!].sort()).toEqual(uids);
      expect(await a.ack(ids.A!)).toBe(ids.A!.length);
      expect(await b.ack(ids.B!)).toBe(ids.B!.length);
      expect(await a.ack(ids.A!)).toBe(0);
      expect(await a.readCompleteGroups({ consumer: "A", max: 10 })).toEqual([]);
      expect(await b.readCompleteGroups({ consumer: "B", max: 10 })).toEqual([]);
    });

    test("an unacked group is redelivered to another consumer after the visibility timeout", async () => {
      const vis = 600;
      const q = open({ visibilityTimeoutMs: vis });
      const q2 = target.sharesState ? open({ visibilityTimeoutMs: vis }) : q;
      await q.expectGroup("r1", 1);
      await q.put(makeRecord("r1", 0));
      const t0 = Date.now();
      const first = await q.readCompleteGroups({ consumer: "dies", max: 5 });
      expect(first.map((g) => g.uid)).toEqual(["r1"]);
      const early = await q2.readCompleteGroups({ consumer: "survivor", max: 5 });
      // Not redelivered while the timeout runs (checkable only when this read came before it passed: a loaded
      // machine can take longer than the timeout between two reads).
      if (Date.now() - t0 < vis) expect(early).toEqual([]);
      let again = early;
      const by = Date.now() + 10_000;
      while (again.length === 0 && Date.now() < by) {
        await sleep(50);
        again = await q2.readCompleteGroups({ consumer: "survivor", max: 5 });
      }
      expect(again.map((g) => [g.uid, g.delivery_id])).toEqual([["r1", first[0]!.delivery_id]]);
      expect(again[0]!.records).toEqual([makeRecord("r1", 0)]);
      expect(await q2.ack([again[0]!.delivery_id])).toBe(1);
      // Acknowledged: never delivered again, however long after.
      await sleep(vis + 100);
      expect(await q.readCompleteGroups({ consumer: "dies", max: 5 })).toEqual([]);
    });

    test("a blocked read returns the group completed while it waits", async () => {
      const q = open();
      const w = target.sharesState ? open() : q;
      await q.expectGroup("b1", 1);
      const reading = q.readCompleteGroups({ consumer: "c", max: 1, block_ms: 5000 });
      await sleep(50);
      await w.put(makeRecord("b1", 0));
      const got = await reading;
      expect(got.map((g) => g.uid)).toEqual(["b1"]);
      expect(await q.readCompleteGroups({ consumer: "c", max: 1, block_ms: 100 })).toEqual([]);
    });

    test("ids, masks and log-probs round-trip exactly (log-probs as float32)", async () => {
      const q = open();
      const logprobs = [-0, -9999, 0.1, -1e-8, -3.4028234663852886e38, -1.401298464324817e-45, -0.6931471805599453];
      const rec = makeRecord("bytes", 0, {
        prompt_ids: [0, 1, 255, 256, 65535, 151643, 2147483647],
        response_ids: [0, 128, 32768, 8388608, 151645, 2 ** 31 - 2, 7],
        response_mask: [0, 1, 1, 0, 1, 0, 1],
        rollout_log_probs: logprobs,
        extra_fields: { model_versions: [1, 2], tool_rewards: [0.5], turn_scores: [0, 1], note: "héllo ✓" },
      });
      await q.expectGroup("bytes", 1);
      expect((await q.put(rec)).stored).toBe(true);
      const expected = { ...rec, rollout_log_probs: logprobs.map(Math.fround) };
      const got = (await q.get("bytes_0_0"))!;
      expect(got).toEqual(expected);
      expect(Object.is(got.rollout_log_probs![0], -0)).toBe(true);
      expect(got.rollout_log_probs![1]).toBe(-9999);
      expect(got.rollout_log_probs![2]).toBe(Math.fround(0.1));
      const [g] = await q.readCompleteGroups({ consumer: "c", max: 1 });
      expect(g!.records).toEqual([expected]);
      expect(Object.is(g!.records[0]!.rollout_log_probs![0], -0)).toBe(true);
      const empty = makeRecord("bytes", 1, { prompt_ids: [], response_ids: [], response_mask: [], rollout_log_probs: null });
      await q.put(empty);
      expect(await q.get("bytes_1_0")).toEqual(empty);
      if (target.rawRecord) {
        const raw = await target.rawRecord(prefix, "bytes_0_0");
        const le = (arr: Int32Array | Float32Array | Uint8Array) => Buffer.from(arr.buffer).toString("base64");
        expect(raw.prompt_ids).toBe(le(Int32Array.from(rec.prompt_ids)));
        expect(raw.response_ids).toBe(le(Int32Array.from(rec.response_ids)));
        expect(raw.response_mask).toBe(le(Uint8Array.from(rec.response_mask)));
        expect(raw.rollout_log_probs).toBe(le(Float32Array.from(logprobs)));
        expect(raw.rollout_log_probs!.slice(0, 8)).toBe("AAAAgAA8");
        expect(Object.keys(raw).sort()).toEqual(["meta", "prompt_ids", "response_ids", "response_mask", "rollout_log_probs"]);
        expect(JSON.parse(raw.meta!).extra_fields.note).toBe("héllo ✓");
        expect("rollout_log_probs" in (await target.rawRecord(prefix, "bytes_1_0"))).toBe(false);
      }
    });

    test("routed experts: stored packed (uint8 for small ids, int32 beyond 65,534, routed_experts_dtype) + JSON shape, read back exactly; a record without them has exactly the old fields, byte for byte", async () => {
      const q = open();
      // Old-style record: every stored field written out by hand.
      const old = makeRecord("re", 0, { rollout_log_probs: [-0.5, -0.25, -0.125] });
      await q.put(old);
      const got = await q.get("re_0_0");
      expect(got).toEqual(old);
      expect("routed_experts" in got!).toBe(false);
      expect("routed_experts_shape" in got!).toBe(false);
      const experts = [0, 7, 3, 4, 2147483647, -1, 5, 6, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25];
      const rec = makeRecord("re", 1, { routed_experts: experts, routed_experts_shape: [2, 2] });
      // 4 prompt + 3 response tokens × 2 layers × 2 top_k = 28 values.
      expect(experts.length).toBe(28);
      await q.put(rec);
      expect(await q.get("re_1_0")).toEqual(rec);
      expect(JSON.stringify(await q.get("re_1_0"))).toBe(JSON.stringify(rec));
      if (target.rawRecord) {
        expect(await target.rawRecord(prefix, "re_0_0")).toEqual({
          meta: '{"key":"re_0_0","uid":"re","session_id":0,"output_index":0,"agent_name":"tool_agent","data_source":"gsm8k","reward_score":1,"num_turns":2,"truncated":false,"finish_reason":"stop","error":null,"metrics":{"generate_sequences":0.5,"tool_calls":0,"compute_score":0.01,"num_preempted":-1},"extra_fields":{"model_versions":[3],"tool_rewards":[],"turn_scores":[]}}',
          prompt_ids: "XFACAGgDAADGAAAAAAAAAA==",
          response_ids: "6yUAAAsAAABdUAIA",
          response_mask: "AQEB",
          rollout_log_probs: "AAAAvwAAgL4AAAC+",
        });
        const raw = await target.rawRecord(prefix, "re_1_0");
        expect(Object.keys(raw).sort()).toEqual(["meta", "prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "routed_experts", "routed_experts_dtype", "routed_experts_shape"]);
        // An id above 65,534 keeps the record int32.
        expect(raw.routed_experts_dtype).toBe("int32");
        expect(raw.routed_experts).toBe(Buffer.from(Int32Array.from(experts).buffer).toString("base64"));
        expect(raw.routed_experts!.slice(0, 16)).toBe("AAAAAAcAAAADAAAA");
        expect(raw.routed_experts_shape).toBe("[2,2]");
        expect(JSON.parse(raw.meta!)).not.toHaveProperty("routed_experts");
      }
      // Ids of 8 experts pack to one byte each, −1 as 0xff: 7 tokens × 2 × 2 = 28 bytes.
      const small = experts.map((v, i) => (i === 4 ? 7 : v % 8));
      const packed = makeRecord("re", 3, { routed_experts: small, routed_experts_shape: [2, 2] });
      await q.put(packed);
      expect(JSON.stringify(await q.get("re_3_0"))).toBe(JSON.stringify(packed));
      expect((await q.get("re_3_0"))!.routed_experts![5]).toBe(-1);
      if (target.rawRecord) {
        const raw = await target.rawRecord(prefix, "re_3_0");
        expect(raw.routed_experts_dtype).toBe("uint8");
        expect(Buffer.from(raw.routed_experts!, "base64").toString("hex")).toBe("00070304" + "07ff0506" + "01020001" + "02030405" + "06070001" + "02030405" + "06070001");
      }
      const e = await rejects(q.put(makeRecord("re", 2, { routed_experts: [1, 2, 3], routed_experts_shape: [2, 2] })));
      expect(e).toBeInstanceOf(InputError);
      expect((e as InputError).field).toBe("record.routed_experts");
      expect((e as InputError).message).toContain("has 3 values, expected (prompt + response) 7 tokens × 2 layers × 2 top_k = 28");
      const e2 = await rejects(q.put(makeRecord("re", 2, { routed_experts: experts })));
      expect((e2 as InputError).field).toBe("record.routed_experts_shape");
      const e3 = await rejects(q.put(makeRecord("re", 2, { routed_experts: experts.map((v, i) => (i === 5 ? 1.5 : v)), routed_experts_shape: [2, 2] })));
      expect((e3 as InputError).field).toBe("record.routed_experts[5]");
    });

    test("N4: a record's model ({name, fingerprint}) is stored in meta after data_source and read back; markFailed keeps it; a bad one is refused naming record.model", async () => {
      const q = open();
      const model = { name: "llama3_1", fingerprint: "a46dd04db0e482fa" };
      const { key, uid, session_id, output_index, agent_name, data_source, ...rest } = makeRecord("md", 0);
      const rec = { key, uid, session_id, output_index, agent_name, data_source, model, ...rest } as TrajectoryRecord;
      await q.put(rec);
      const got = await q.get("md_0_0");
      expect(got!.model).toEqual(model);
      expect(JSON.stringify(got)).toBe(JSON.stringify(rec));
      if (target.rawRecord) {
        expect((await target.rawRecord(prefix, "md_0_0")).meta!.startsWith('{"key":"md_0_0","uid":"md","session_id":0,"output_index":0,"agent_name":"tool_agent","data_source":"gsm8k","model":{"name":"llama3_1","fingerprint":"a46dd04db0e482fa"},"reward_score":1,')).toBe(true);
      }
      await q.markFailed("md_1_0", "model mismatch", { model });
      expect((await q.get("md_1_0"))!.model).toEqual(model);
      const e = await rejects(q.put(makeRecord("md", 2, { model: { name: "qwen3", fingerprint: "XYZ" } })));
      expect(e).toBeInstanceOf(InputError);
      expect((e as InputError).field).toBe("record.model.fingerprint");
      // A record without a model reads back without the key (old records are unchanged byte for byte, see the routed-experts test).
      await q.put(makeRecord("md", 3));
      expect("model" in (await q.get("md_3_0"))!).toBe(false);
    });

    test("bad keys and records are rejected with an InputError naming the field", async () => {
      const q = open();
      const check = async (p: Promise<unknown>, field: string, msg: RegExp) => {
        const e = await rejects(p);
        expect(e).toBeInstanceOf(InputError);
        expect((e as InputError).field).toBe(field);
        expect((e as InputError).message).toMatch(msg);
      };
      await check(q.expectGroup("a_b", 2), "uid", /'_' separates key parts/);
      await check(q.expectGroup("ok", 0), "n", /integer in 1\.\.1000000/);
      await check(q.expectGroup("ok", 2, "test" as "val"), "partition", /"train" or "val"/);
      await check(q.get("no-separators"), "key", /is not a trajectory key/);
      await check(q.markFailed("a_b_1_0", "x"), "key", /is not a trajectory key/);
      await check(q.put(makeRecord("u", 0, { key: "u_1_0" })), "record.key", /must equal \{uid\}_\{session_id\}_\{output_index\} = 'u_0_0'/);
      await check(q.put(makeRecord("u", 0, { uid: "u_x", key: "u_x_0_0" })), "record.uid", /'_' separates key parts/);
      await check(q.put(makeRecord("u", 0, { prompt_ids: [1, -2] })), "record.prompt_ids[1]", /^record\.prompt_ids\[1\]: token id must be an integer in 0\.\.2147483647, got -2$/);
      await check(q.put(makeRecord("u", 0, { response_mask: [1, 2, 1] as (0 | 1)[] })), "record.response_mask[1]", /must be 0 or 1, got 2/);
      await check(q.put(makeRecord("u", 0, { rollout_log_probs: [0, Number.NaN, 0] })), "record.rollout_log_probs[1]", /must be a finite number, got NaN/);
      await check(q.put(makeRecord("u", 0, { response_mask: [1, 1] })), "record.response_mask", /has 2 entries, response_ids has 3/);
      await check(q.put(makeRecord("u", 0, { rollout_log_probs: [0] })), "record.rollout_log_probs", /has 1 entries/);
      await check(q.put(makeRecord("u", 0, { response_ids: [1, 2, 2 ** 31] })), "record.response_ids[2]", /got 2147483648$/);
      await check(q.put({ ...makeRecord("u", 0), finish_reason: "done" } as unknown as TrajectoryRecord), "record.finish_reason", /./);
      await check(q.readCompleteGroups({ consumer: "", max: 1 }), "consumer", /non-empty/);
      await check(q.readCompleteGroups({ consumer: "c", max: 0 }), "max", /1\.\.10000/);
      expect(await q.get("u_0_0")).toBeNull();
    });

    test("cancelGroups withdraws incomplete groups: never delivered, later writes refused, stored records kept", async () => {
      const q = open();
      if (!q.cancelGroups) return expect(name).toBe("an adapter without cancelGroups");
      await q.expectGroup("cw", 2);
      await q.expectGroup("cc", 1);
      await q.put(makeRecord("cw", 0));
      await q.put(makeRecord("cc", 0));
      expect(await q.cancelGroups(["cw", "cc", "cw"])).toEqual({ withdrawn: ["cw"], complete: ["cc"] });
      expect(await q.groupStatus("cw")).toEqual({ uid: "cw", partition: "train", expected: 2, finished: 1, records: 1, failed: 0, complete: false, fingerprint: null, cancelled: true });
      expect(await q.groupStatus("cc")).toEqual({ uid: "cc", partition: "train", expected: 1, finished: 1, records: 1, failed: 0, complete: true, fingerprint: null });
      for (const p of [q.put(makeRecord("cw", 1)), q.markFailed("cw_1_0", "boom"), q.finishSession("cw", 1, 0)]) {
        const e = (await rejects(p)) as { name: string; code: string; status: number };
        expect([e.name, e.code, e.status]).toEqual(["GroupCancelledError", "group_cancelled", 409]);
      }
      expect(await q.get("cw_0_0")).toEqual(makeRecord("cw", 0));
      expect(await q.get("cw_1_0")).toBeNull();
      const got = await q.readCompleteGroups({ consumer: "c", max: 10 });
      expect(got.map((g) => g.uid)).toEqual(["cc"]);
      // Idempotent: a withdrawn group is withdrawn again, a delivered one stays complete.
      expect(await q.cancelGroups(["cw", "cc"])).toEqual({ withdrawn: ["cw"], complete: ["cc"] });
      expect(await q.readCompleteGroups({ consumer: "c2", max: 10 })).toEqual([]);
      expect(await q.filterGroup?.("cw", "reward all_equal 1")).toBe(false);
      expect(await q.filterGroup?.("cc", "reward all_equal 1")).toBe(false);
    });

    test("filterGroup keeps a group from trainers: complete, listed with its reason by filteredGroups, never delivered", async () => {
      const q = open();
      if (!q.filterGroup || !q.filteredGroups) return expect(name).toBe("an adapter without filterGroup");
      await q.expectGroup("fa", 2);
      await q.expectGroup("fb", 1);
      await q.expectGroup("fv", 1, "val");
      await q.put(makeRecord("fa", 1));
      expect(await q.filterGroup("fa", "reward all_equal 1")).toBe(true);
      expect(await q.filterGroup("fa", "reward all_equal 1")).toBe(true);
      expect(await q.filterGroup("fv", "reward all_equal 0")).toBe(true);
      expect(await q.filteredGroups({ max: 10 })).toEqual([]);
      await q.put(makeRecord("fa", 0));
      await q.put(makeRecord("fb", 0));
      await q.put(makeRecord("fv", 0));
      expect(await q.groupStatus("fa")).toEqual({ uid: "fa", partition: "train", expected: 2, finished: 2, records: 2, failed: 0, complete: true, fingerprint: null, filtered: true });
      expect((await q.readCompleteGroups({ consumer: "c", max: 10 })).map((g) => g.uid)).toEqual(["fb"]);
      expect(await q.filteredGroups({ max: 10 })).toEqual([{ uid: "fa", partition: "train", reason: "reward all_equal 1", failed: 0, records: [makeRecord("fa", 0), makeRecord("fa", 1)] }]);
      expect(await q.filteredGroups({ max: 10, partition: "val" })).toEqual([{ uid: "fv", partition: "val", reason: "reward all_equal 0", failed: 0, records: [makeRecord("fv", 0)] }]);
      expect(await q.readCompleteGroups({ consumer: "c", max: 10, partition: "val" })).toEqual([]);
      // A delivered group cannot be filtered any more; a complete filtered group counts as complete for a cancel.
      expect(await q.filterGroup("fb", "late")).toBe(false);
      expect((await q.groupStatus("fb")).filtered).toBeUndefined();
      expect(await q.cancelGroups?.(["fa"])).toEqual({ withdrawn: [], complete: ["fa"] });
      // Reasons are kept to 500 characters.
      await q.expectGroup("fl", 1);
      expect(await q.filterGroup("fl", "r".repeat(700))).toBe(true);
      await q.put(makeRecord("fl", 0));
      expect((await q.filteredGroups({ max: 10 })).map((g) => [g.uid, g.reason.length])).toEqual([["fa", 18], ["fl", 500]]);
      expect(await q.filteredGroups({ max: 1 })).toHaveLength(1);
    });

    test("train and val partitions never mix", async () => {
      const q = open();
      await q.expectGroup("v1", 1, "val");
      await q.expectGroup("t1", 1, "train");
      await q.put(makeRecord("v1", 0));
      await q.put(makeRecord("t1", 0));
      expect((await q.groupStatus("v1")).partition).toBe("val");
      const train = await q.readCompleteGroups({ consumer: "c", max: 10 });
      expect(train.map((g) => [g.uid, g.partition])).toEqual([["t1", "train"]]);
      const val = await q.readCompleteGroups({ consumer: "c", max: 10, partition: "val" });
      expect(val.map((g) => [g.uid, g.partition])).toEqual([["v1", "val"]]);
      expect(await q.ack([train[0]!.delivery_id])).toBe(1);
      expect(await q.ack([val[0]!.delivery_id], "train")).toBe(0);
      expect(await q.ack([val[0]!.delivery_id], "val")).toBe(1);
    });

    test("a trajectory tree reads whole by default and as tree nodes with deliver: tree (each branch its tokens from branch_at on, exactly)", async () => {
      const q = open();
      await q.expectGroup("tree1", 1);
      const recs = treeRecords("tree1");
      for (let i = 0; i < recs.length; i++) expect(await q.put(recs[i]!, { last: i === recs.length - 1 })).toEqual({ key: recs[i]!.key, stored: true });
      // Stored whole: a get (and every other read) returns the records as put.
      expect(await q.get("tree1_0_3")).toEqual(recs[3]!);
      await expect(q.readCompleteGroups({ consumer: "c", max: 1, deliver: "bogus" as "tree" })).rejects.toThrow(/deliver/);
      const [g] = await q.readCompleteGroups({ consumer: "c", max: 1, deliver: "tree" });
      expect(g!.records).toEqual(treeNodesOf("tree1"));
      expect(g!.records.map((r) => r.tree_prompt_length)).toEqual([undefined, 3, 4, 3, undefined]);
      expect(await q.ack([g!.delivery_id])).toBe(1);
    });
  });
}
