import { describe, expect, test } from "bun:test";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";

// The in-process carry host's storage (memory store, partial_rollout: carry): a checkpoint no later batch
// resumes is dropped once it has gone unwritten for idleTtlMs, whether it is read again or not.
describe("MemorySessionStorage idleTtlMs", () => {
  test("an entry unwritten for the idle TTL is gone on read and swept on a later write; written ones stay", async () => {
    let now = 1_000_000;
    const s = new MemorySessionStorage(() => now, { idleTtlMs: 10_000 });
    await s.append("carried_0_0", 0, "d0", { input: "in" });
    await s.append("live_0_0", 0, "d0", { input: "in" });
    now += 6_000;
    await s.append("live_0_0", 1, "d1");
    expect(await s.stepOf("carried_0_0")).toBe(0);
    now += 5_000;
    // carried: 11 s since its write (expired); live: 5 s.
    expect(s.size).toBe(2);
    await s.append("other_0_0", 0, "d0");
    expect(s.size).toBe(2);
    expect(await s.get("carried_0_0")).toBeNull();
    expect(await s.get("live_0_0")).toEqual({ input: "in", deltas: ["d0", "d1"], step: 1 });
    now += 10_000;
    expect(await s.stepOf("live_0_0")).toBeNull();
    // Without the option nothing expires.
    const plain = new MemorySessionStorage(() => now);
    await plain.append("k_0_0", 0, "d0");
    now += 1e12;
    expect(await plain.stepOf("k_0_0")).toBe(0);
  });
});
