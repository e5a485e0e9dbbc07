/**
 * The process the crash test kills: runs a batch with durable sessions in
 * Redis through the CLI's runtime (`buildRuntime`), logging every transfer-
 * queue write (`key stored`) to a file synchronously, so a SIGKILL loses none.
 * Env: CRASH_PREFIX, CRASH_ENGINE (URL), CRASH_TOOLS (tools file), CRASH_ROWS,
 * CRASH_N, CRASH_LOG, CRASH_CONCURRENCY.
 */
import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import type { TransferQueue } from "../../shared/store/types.ts";

const env = process.env;
const log = env.CRASH_LOG!;
const rows = readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .slice(0, Number(env.CRASH_ROWS ?? 50))
  .map((l, i) => ({ ...JSON.parse(l), uid: `crash${i}` }));

const logging = (q: TransferQueue): TransferQueue => ({
  ...q,
  expectGroup: (u, n, p) => q.expectGroup(u, n, p),
  get: (k) => q.get(k),
  groupStatus: (u) => q.groupStatus(u),
  readCompleteGroups: (o) => q.readCompleteGroups(o),
  ack: (ids, p) => q.ack(ids, p),
  close: () => q.close(),
  put: async (r) => {
    appendFileSync(log, `${r.key} attempt\n`);
    const res = await q.put(r);
    appendFileSync(log, `${r.key} ${res.stored ? "stored" : "dup"}\n`);
    return res;
  },
  markFailed: async (k, reason, f) => {
    appendFileSync(log, `${k} attempt\n`);
    const res = await q.markFailed(k, reason, f);
    appendFileSync(log, `${k} ${res.stored ? "stored" : "dup"} failed\n`);
    return res;
  },
});

const runtime = await buildRuntime(
  {
    store: process.env.REDIS_URL ?? "redis://127.0.0.1:6379",
    storePrefix: env.CRASH_PREFIX,
    engine: env.CRASH_ENGINE,
    tools: env.CRASH_TOOLS,
    n: Number(env.CRASH_N ?? 4),
    seed: 7,
    concurrency: Number(env.CRASH_CONCURRENCY ?? 32),
    maxModelLen: 4096,
  },
  { wrapStore: logging },
);
const { run } = runtime.service.submit({ rows, global_steps: 3, model_version: "v1", validate: false });
await run.run();
const s = run.stats();
console.log(JSON.stringify({ ok: s.counts.ok, failed: s.counts.failed, errors: s.errors.slice(0, 3) }));
await runtime.close();
process.exit(0);
