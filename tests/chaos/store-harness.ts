import { join } from "node:path";
import { expect } from "bun:test";

/** The repo root and the CLI entry. */
export const ROOT = join(import.meta.dir, "..", "..");
export const MAIN = join(ROOT, "infra", "cli", "main.ts");

/** A spawned `edgeloop` process whose stderr is collected as it comes. */
export interface CliProc {
  proc: ReturnType<typeof Bun.spawn>;
  /** stderr so far. */
  err(): string;
  /** stdout so far. */
  out(): string;
}

/** Spawns `bun infra/cli/main.ts …args` and collects its output. */
export function spawnCli(args: string[], env: Record<string, string> = {}): CliProc {
  const proc = Bun.spawn([process.execPath, MAIN, ...args], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", ...env } });
  let err = "";
  let out = "";
  const pump = async (s: ReadableStream<Uint8Array>, add: (t: string) => void) => {
    const dec = new TextDecoder();
    for await (const chunk of s) add(dec.decode(chunk, { stream: true }));
  };
  void pump(proc.stderr as ReadableStream<Uint8Array>, (t) => (err += t));
  void pump(proc.stdout as ReadableStream<Uint8Array>, (t) => (out += t));
  return { proc, err: () => err, out: () => out };
}

/** Spawns `edgeloop serve --port 0 …` and resolves with its base URL once it listens. */
export async function spawnServe(args: string[], env: Record<string, string> = {}): Promise<CliProc & { url: string }> {
  const p = spawnCli(["serve", "--port", "0", ...args], env);
  const deadline = Date.now() + 60_000; // a bound for a hang only (start-up takes seconds; longer on a loaded machine)
  for (;;) {
    const m = /serving on (http:\/\/[^\s]+)/.exec(p.out());
    if (m) return { ...p, url: m[1]! };
    if (p.proc.exitCode !== null || Date.now() > deadline) throw new Error(`serve did not start: ${p.err()}`);
    await Bun.sleep(50);
  }
}

/** Polls `fn` every `everyMs` until it returns a truthy value or `timeoutMs` passes (then throws with `what`). */
export async function until<T>(fn: () => Promise<T>, what: string, timeoutMs = 60_000, everyMs = 100): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => null);
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(everyMs);
  }
}

/** Batch progress as `GET /v1/rollouts/{id}` reports it (the fields these tests read). */
export interface Progress {
  done: boolean;
  counts: { total: number; pending: number; running: number; finished: number; reused: number; records: number; ok: number; failed: number; truncated: number };
  errors: { key: string; error: string }[];
  lost: { count: number; keys: string[]; missing: string[]; reason: string } | null;
}

export async function progress(base: string, id: string): Promise<Progress> {
  const res = await fetch(`${base}/v1/rollouts/${id}`);
  expect(res.status).toBe(200);
  return (await res.json()) as Progress;
}

export async function post(base: string, rows: unknown[], config?: unknown): Promise<{ batch_id: string; keys: string[] }> {
  const res = await fetch(`${base}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, ...(config ? { config } : {}) }) });
  const body = await res.text();
  if (res.status !== 202) throw new Error(`POST /v1/rollouts answered ${res.status}: ${body}`);
  return JSON.parse(body);
}

/** Reads complete groups (`GET /v1/groups`) and acks them until `uids` were all delivered or `timeoutMs` passed; returns uid → record keys, in delivery order. */
export async function drainGroups(base: string, uids: readonly string[], timeoutMs = 30_000): Promise<Map<string, string[][]>> {
  const seen = new Map<string, string[][]>();
  const deadline = Date.now() + timeoutMs;
  while (uids.some((u) => !seen.has(u)) && Date.now() < deadline) {
    const res = await fetch(`${base}/v1/groups?max=100&block_ms=500&consumer=trainer`);
    expect(res.status).toBe(200);
    const { groups } = (await res.json()) as { groups: { uid: string; delivery_id: string; records: { key: string }[] }[] };
    for (const g of groups) seen.set(g.uid, [...(seen.get(g.uid) ?? []), g.records.map((r) => r.key)]);
    if (groups.length) {
      const ack = await fetch(`${base}/v1/groups/ack`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ delivery_ids: groups.map((g) => g.delivery_id) }) });
      expect(ack.status).toBe(200);
    }
  }
  return seen;
}

/** The worker's exit summary (its last stdout line). */
export function summaryOf(p: CliProc): { exit: string; completed: number; claimed: number } {
  return JSON.parse(p.out().trim().split("\n").pop()!);
}
