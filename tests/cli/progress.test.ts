import { expect, test } from "bun:test";
import { PassThrough } from "node:stream";
import { formatDuration, RolloutProgress } from "../../infra/cli/progress.ts";

// The rollout progress with a stepped clock: plain lines with rate and ETA when not a terminal, a bar with
// both on one, and a stall warning while no session finishes.

function clock() {
  let t = 0;
  return { now: () => t, at: (s: number) => void (t = s * 1000) };
}

test("plain lines: the first at once, then at most every lineEveryS, with sessions/s and the ETA; the last once when done", () => {
  const c = clock();
  const lines: string[] = [];
  const p = new RolloutProgress({ total: 100, tty: false, log: (l) => lines.push(l), stallWarnS: 0, lineEveryS: 10, stallHint: "-", nowMs: c.now });
  c.at(2);
  p.update({ finished: 4, records: 4, failed: 1, running: 8 });
  c.at(5);
  p.update({ finished: 10, records: 10, failed: 1, running: 8 });
  c.at(12.5);
  p.tick();
  p.update({ finished: 25, records: 25, failed: 1, running: 8 });
  c.at(40);
  p.update({ finished: 100, records: 100, failed: 2, running: 0 });
  p.update({ finished: 100, records: 100, failed: 2, running: 0 });
  p.stop();
  expect(lines).toEqual([
    "progress   4/100 sessions, 4 records (1 failed), 2.0 sessions/s, ETA 48s",
    "progress   10/100 sessions, 10 records (1 failed), 0.8 sessions/s, ETA 1m53s",
    "progress   100/100 sessions, 100 records (2 failed), 2.5 sessions/s",
  ]);
});

test("stall warning: after stallWarnS without a finished session, once per period, reset by progress", () => {
  const c = clock();
  const lines: string[] = [];
  const p = new RolloutProgress({ total: 2, tty: false, log: (l) => lines.push(l), stallWarnS: 60, lineEveryS: 1000, stallHint: "is the engine hung?", nowMs: c.now });
  c.at(1);
  p.update({ finished: 1, records: 1, failed: 0, running: 1 });
  for (const s of [30, 60, 61, 90, 121, 150]) {
    c.at(s);
    p.tick();
  }
  c.at(200);
  p.update({ finished: 2, records: 2, failed: 0, running: 0 });
  c.at(400);
  p.tick();
  expect(lines).toEqual([
    "progress   1/2 sessions, 1 records (0 failed), 1.0 sessions/s, ETA 1s",
    "warning    no session finished for 1m00s: 1/2 finished, 1 running; is the engine hung?",
    "warning    no session finished for 2m00s: 1/2 finished, 1 running; is the engine hung?",
    "progress   2/2 sessions, 2 records (0 failed), 0.0 sessions/s",
  ]);
});

test("on a terminal: a bar with the rate and the ETA", () => {
  const c = clock();
  const out = new PassThrough();
  let text = "";
  out.on("data", (d) => (text += d.toString()));
  Object.assign(out, { isTTY: true, columns: 200, cursorTo: () => true, clearLine: () => true, moveCursor: () => true });
  const p = new RolloutProgress({ total: 10, tty: true, log: () => {}, stallWarnS: 0, stallHint: "-", nowMs: c.now, stream: out });
  c.at(2);
  p.update({ finished: 4, records: 5, failed: 1, running: 2 });
  p.stop();
  expect(text).toContain("| 4/10 sessions | 5 records | 1 failed | 2.0 sessions/s | ETA 3s");
});

test("formatDuration", () => {
  expect([0.4, 42, 185, 7800].map(formatDuration)).toEqual(["0s", "42s", "3m05s", "2h10m"]);
});
