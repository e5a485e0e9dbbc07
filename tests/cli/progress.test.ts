import { expect, test } from "bun:test";
import { PassThrough } from "node:stream";
import { formatDuration, RolloutProgress, stallHintFor } from "../../infra/cli/progress.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { WaitTracker } from "../../shared/telemetry/waits.ts";

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

test("N5: the stall hint names what the running sessions wait on: engine, a tool by name, the agent, the reward", () => {
  const waits = new WaitTracker();
  const config = parseAppConfig({ engine: { timeout_ms: 5000, max_retries: 1 }, agent: { timeout_ms: 9000 }, reward: { timeout_ms: 700, max_retries: 4 } });
  const hint = () => stallHintFor(waits.snapshot(), config, "idle");
  expect(hint()).toBe("idle");
  const calc = [waits.begin({ kind: "tool", name: "calc" }), waits.begin({ kind: "tool", name: "calc" })];
  const engine = waits.begin({ kind: "engine" });
  expect(hint()).toBe(
    "waiting on tool `calc` (2 calls): a call waits up to the tool's timeout_ms per attempt and is retried max_retries times (tools file) before it becomes an error observation; " +
      "the engine (1 call): is it hung? A request waits up to engine.timeout_ms (5000 ms) and is retried 1 times before its trajectory fails",
  );
  calc.forEach((end) => end());
  calc[0]!(); // ending twice changes nothing
  engine();
  const agent = waits.begin({ kind: "agent", name: "http://agent:9/run" });
  const reward = waits.begin({ kind: "reward" });
  // A tool name is model text: escaped, cut to 64 characters.
  const evil = waits.begin({ kind: "tool", name: "x\u001b]0;owned\u0007" + "y".repeat(100) });
  expect(hint()).toBe(
    "waiting on tool `x\\x1b]0;owned\\x07" + "y".repeat(53) + "` (1 call): a call waits up to the tool's timeout_ms per attempt and is retried max_retries times (tools file) before it becomes an error observation; " +
      "the agent at http://agent:9/run (1 session): it has agent.timeout_ms (9000 ms) to call the model and finish; " +
      "the reward (1 call): a webhook call waits up to reward.timeout_ms (700 ms) and is retried 4 times",
  );
  [agent, reward, evil].forEach((end) => end());
  expect(waits.snapshot()).toEqual([]);
});

test("N5: a stall hint given as a function is asked at each warning", () => {
  const c = clock();
  const lines: string[] = [];
  let now = "waiting on A";
  const p = new RolloutProgress({ total: 1, tty: false, log: (l) => lines.push(l), stallWarnS: 10, lineEveryS: 1000, stallHint: () => now, nowMs: c.now });
  c.at(10);
  p.tick();
  now = "waiting on B";
  c.at(20);
  p.tick();
  expect(lines).toEqual(["warning    no session finished for 10s: 0/1 finished, 0 running; waiting on A", "warning    no session finished for 20s: 0/1 finished, 0 running; waiting on B"]);
});
