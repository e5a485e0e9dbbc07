import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { InputError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { checkDelivery, deliverGroups, resolveTree, treeNode, treeNodes } from "../../shared/store/tree-delivery.ts";
import { makeRecord } from "./contract.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { fakeExecutor } from "../helpers/fake-executor.ts";
import { treeNodesOf, treeRecords } from "../helpers/tree-records.ts";

describe("trajectory trees delivered as a tree (read option deliver: tree)", () => {
  test("each branch whose parent is delivered holds only its tokens from branch_at on, exactly; a record that breaks the prefix it names stays whole", () => {
    const recs = treeRecords("t1");
    const nodes = treeNodes(recs);
    expect(nodes).toEqual(treeNodesOf("t1"));
    // Stated by hand for the nested branch: 7 tokens whole, 1 token (60) as a node of _1, which branches at 5 from _0.
    expect(nodes[3]!.prompt_ids).toEqual([]);
    expect(nodes[3]!.response_ids).toEqual([60]);
    expect(nodes[4]).toBe(recs[4]!);
    expect(nodes[4]!.tree_prompt_length).toBeUndefined();
    expect(nodes[0]).toBe(recs[0]!);
  });

  test("resolveTree gives back every whole record, nested branches included, in any order", () => {
    const recs = treeRecords("t2");
    expect(resolveTree(treeNodes(recs))).toEqual(recs);
    const shuffled = treeNodes(recs).reverse();
    expect(resolveTree(shuffled)).toEqual(recs.slice().reverse());
    // A node without a delivered parent cannot be resolved: said, naming the field.
    const orphan = treeNodes(recs).slice(1, 2);
    expect(() => resolveTree(orphan)).toThrow(InputError);
    expect(() => resolveTree(orphan)).toThrow(/parent_key.*t2_0_0/);
  });

  test("a branch whose parent is not delivered (another role's, a failed one) stays whole", () => {
    const recs = treeRecords("t3");
    expect(treeNodes(recs.slice(1, 2))).toEqual([recs[1]!]);
    const failedParent = { ...recs[0]!, error: "engine unavailable" };
    expect(treeNodes([failedParent, recs[1]!])[1]).toBe(recs[1]!);
    // A mask or log-prob that differs inside the shared response span: no cut (it could not be given back).
    const otherMask = { ...recs[1]!, response_mask: [1, 0, 1, 1] as (0 | 1)[] };
    expect(treeNode(recs[0]!, otherMask)).toBe(otherMask);
    const otherLp = { ...recs[1]!, rollout_log_probs: [-1, -2.5, -3.5, -0.5] };
    expect(treeNode(recs[0]!, otherLp)).toBe(otherLp);
    // A routed-expert row inside the shared prefix that differs (separate prefills need not route alike): no cut —
    // a node keeps no prefix rows, so resolveTree would hand back the parent's (fresh-user trial).
    const otherExperts = { ...recs[1]!, routed_experts: [0, 1, 2, 3, 4, 5, 6, 7, 8, 77, 100, 101, 102, 103] };
    expect(treeNode(recs[0]!, otherExperts)).toBe(otherExperts);
    expect(resolveTree(treeNodes([recs[0]!, otherExperts]))).toEqual([recs[0]!, otherExperts]);
    // branch_at past the parent's tokens: no cut.
    const far = { ...recs[1]!, branch_at: 8 };
    expect(treeNode(recs[0]!, far)).toBe(far);
  });

  test("deliver is checked at the boundary, naming the option", () => {
    expect(checkDelivery(undefined)).toBe("leaves");
    expect(checkDelivery("tree")).toBe("tree");
    expect(() => checkDelivery("trees")).toThrow(/deliver.*"leaves" or "tree".*"trees"/);
    expect(() => checkDelivery(1)).toThrow(InputError);
    const g = { uid: "u", partition: "train" as const, delivery_id: "1-0", n: 1, reason: "complete", failed: 0, records: treeRecords("t4") };
    expect(deliverGroups([g], "leaves")[0]).toBe(g);
    expect(deliverGroups([g], "tree")[0]!.records).toEqual(treeNodesOf("t4"));
  });

  test("a record in tree-node form is refused by put, naming tree_prompt_length (only whole records are stored)", async () => {
    const q = new MemoryTransferQueue();
    const node = treeNodesOf("t5")[1]!;
    await expect(q.put(node)).rejects.toThrow(/record\.tree_prompt_length/);
    expect(await q.get(node.key)).toBeNull();
  });

  test("put refuses a tree place a record cannot have, naming the field; nothing is stored (validateAndEncode, which every queue runs)", async () => {
    const q = new MemoryTransferQueue();
    const [r0, r1, r2] = treeRecords("t6");
    const cases: [Partial<TrajectoryRecord>, RegExp][] = [
      [{ branch_at: null }, /record\.parent_key.*set without branch_at/],
      [{ branch_at: undefined }, /record\.parent_key.*set without branch_at/],
      [{ parent_key: null }, /record\.branch_at.*set without parent_key/],
      [{ parent_key: "t6_0_1" }, /record\.parent_key.*'t6_0_1' must name an earlier record of the same session, t6_0_\{i\} with i < 1/],
      [{ parent_key: "t6_0_7" }, /record\.parent_key/],
      [{ parent_key: "other_0_0" }, /record\.parent_key/],
      [{ parent_key: "t6_1_0" }, /record\.parent_key/],
      [{ parent_key: "not a key" }, /record\.parent_key/],
      [{ branch_at: 8 }, /record\.branch_at.*is 8, past the record's own 7 prompt \+ response tokens/],
    ];
    for (const [over, re] of cases) {
      await expect(q.put({ ...r1!, ...over })).rejects.toThrow(re);
      expect(await q.get(r1!.key)).toBeNull();
    }
    // The edges are accepted: a root with both null or both absent; a branch at the record's very end (7) or at 0.
    const { parent_key: _p, branch_at: _b, ...bare } = r0!;
    await new MemoryTransferQueue().put(bare as TrajectoryRecord);
    await q.put(r0!, { last: false });
    await q.put({ ...r1!, branch_at: 7 }, { last: false });
    await q.put({ ...r2!, branch_at: 0 });
    expect((await q.get(r1!.key))!.branch_at).toBe(7);
    expect((await q.get(r2!.key))!.branch_at).toBe(0);
    expect((await q.get(r0!.key))!.parent_key ?? null).toBeNull();
  });

  test("property: for random trees (branches after, inside and at the end of the parent's tokens), resolveTree(treeNodes(x)) = x and each node stores its path minus branch_at tokens", () => {
    const arb = fc.record({
      rootP: fc.integer({ min: 1, max: 6 }),
      rootR: fc.integer({ min: 0, max: 8 }),
      branches: fc.array(fc.record({ parent: fc.nat(), at: fc.nat(), ownP: fc.integer({ min: 0, max: 3 }), ownR: fc.integer({ min: 0, max: 5 }), seed: fc.integer({ min: 0, max: 1000 }) }), { maxLength: 6 }),
      logprobs: fc.boolean(),
    });
    fc.assert(
      fc.property(arb, ({ rootP, rootR, branches, logprobs }) => {
        let next = 1000;
        const tok = () => next++;
        const recs: TrajectoryRecord[] = [];
        const mk = (i: number, prompt: number[], resp: number[], mask: (0 | 1)[], lp: number[], parent: number | null, at: number | null) =>
          makeRecord("p", 0, { key: `p_0_${i}`, output_index: i, prompt_ids: prompt, response_ids: resp, response_mask: mask, rollout_log_probs: logprobs ? lp : null, parent_key: parent === null ? null : `p_0_${parent}`, branch_at: at });
        const resp0 = Array.from({ length: rootR }, tok);
        recs.push(mk(0, Array.from({ length: rootP }, tok), resp0, resp0.map((t) => (t % 3 === 0 ? 0 : 1)), resp0.map((t) => -(t % 7) / 4), null, null));
        for (const b of branches) {
          const i = recs.length;
          const par = recs[b.parent % i]!;
          const P = par.prompt_ids.length;
          const len = P + par.response_ids.length;
          // A branch after a response position keeps the parent's prompt; one inside the prompt renders its own prompt from there.
          const at = b.at % (len + 1);
          const path = [...par.prompt_ids, ...par.response_ids];
          let prompt: number[], resp: number[], mask: (0 | 1)[], lp: number[];
          if (at <= P) {
            prompt = [...path.slice(0, at), ...Array.from({ length: b.ownP + (at === 0 ? 1 : 0) }, tok)];
            resp = Array.from({ length: b.ownR }, tok);
            mask = resp.map(() => 1);
            lp = resp.map((_, k) => -(b.seed + k) / 8);
          } else {
            prompt = par.prompt_ids.slice();
            const own = Array.from({ length: b.ownR }, tok);
            resp = [...par.response_ids.slice(0, at - P), ...own];
            mask = [...par.response_mask.slice(0, at - P), ...own.map(() => 1 as const)];
            lp = [...(par.rollout_log_probs ?? par.response_ids.map(() => 0)).slice(0, at - P), ...own.map((_, k) => -(b.seed + k) / 8)];
          }
          recs.push(mk(i, prompt, resp, mask, lp, b.parent % i, at));
        }
        const nodes = treeNodes(recs);
        for (let i = 1; i < recs.length; i++) {
          const whole = recs[i]!.prompt_ids.length + recs[i]!.response_ids.length;
          expect(nodes[i]!.prompt_ids.length + nodes[i]!.response_ids.length).toBe(whole - recs[i]!.branch_at!);
          expect(nodes[i]!.tree_prompt_length).toBe(recs[i]!.prompt_ids.length);
        }
        expect(resolveTree(nodes)).toEqual(recs);
      }),
      { numRuns: 300 },
    );
  });

  test("GET /v1/groups?deliver=tree gives the tree nodes; a bad value is a 400 naming deliver", async () => {
    const store = new MemoryTransferQueue();
    await store.expectGroup("h1", 1);
    const recs = treeRecords("h1");
    for (let i = 0; i < recs.length; i++) await store.put(recs[i]!, { last: i === recs.length - 1 });
    const api = createRolloutsApp({ service: new RolloutService({ config: parseAppConfig({}), store, executorFor: () => fakeExecutor() }) });
    const bad = await api.request("/v1/groups?deliver=trees");
    expect([bad.status, ((await bad.json()) as { error: { field: string } }).error.field]).toEqual([400, "deliver"]);
    const body = (await (await api.request("/v1/groups?consumer=t&deliver=tree")).json()) as { groups: { records: TrajectoryRecord[] }[] };
    expect(body.groups[0]!.records).toEqual(treeNodesOf("h1"));
  });
});
