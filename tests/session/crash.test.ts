import { describe, expect, test } from "bun:test";
import { requireRedis } from "../helpers/redis.ts";
import { comparableRecord, crashRun, mulberry32 } from "./crash.ts";

const redis = await requireRedis();

describe.skipIf(!redis)("crash test: SIGKILL the session host, restart, compare", () => {
  test("120 trajectories, 3 kills: all complete, each key stored once, no call executed twice, records identical to a run without kills", async () => {
    const reference = await crashRun({ rows: 30, n: 4, kills: 0, random: mulberry32(1) });
    const crashed = await crashRun({ rows: 30, n: 4, kills: 3, random: mulberry32(42) });
    console.log(
      `crash test: ${crashed.records.size} trajectories, ${crashed.kills} kills after [${crashed.killAfterWrites.join(", ")}] records, ` +
        `${crashed.deduped} second writes answered "already stored" by the queue, ${crashed.callIds} call ids, ${crashed.executions} executions, ` +
        `${crashed.resent} re-sends after kills; ${Math.round(crashed.ms)} ms (reference ${Math.round(reference.ms)} ms)`,
    );
    expect(reference.records.size).toBe(120);
    expect(crashed.records.size).toBe(120);
    // At most one write per key stored a record; a second attempt happens only when a kill cut the first one short.
    for (const [key, n] of crashed.stored) expect(`${key} ${n}`).toBe(`${key} 1`);
    const twice = [...crashed.attempts].filter(([, n]) => n > 1).length;
    console.log(`crash test: ${crashed.stored.size} keys stored by a logged write, ${twice} keys with a second write attempt`);
    // A second attempt only follows a first one that a kill cut short (it never stored: no key has two stored writes).
    expect(crashed.attempts.size).toBe(120);
    expect(crashed.executions).toBe(reference.executions);
    expect(crashed.executions).toBe(crashed.callIds);
    for (const [key, r] of reference.records) {
      expect(r.error).toBeNull();
      expect(comparableRecord(crashed.records.get(key)!)).toEqual(comparableRecord(r));
    }
  }, 300_000); // a bound for a hang only: five child starts of bun, each loading the tokenizer, take over 60 s on a loaded machine
});
