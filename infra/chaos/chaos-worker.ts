/**
 * One worker process of the chaos run (`infra/chaos/chaos-run.ts` spawns and
 * SIGKILLs these): `edgeloop worker` — the CLI runtime plus a {@link JobWorker}
 * — with every transfer-queue write logged synchronously to a file as
 * `<key> stored|dup`, so the driver can count writes per key even across
 * kills (a line is written before the next write starts).
 *
 * Flags: --store URL --prefix P --engine URL --tools FILE --consumer NAME
 * --log FILE [--concurrency C] [--lease S] [--idle-exit S] [--max-model-len N].
 * Prints the worker's JSON summary on exit.
 */
import { appendFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { buildRuntime } from "../cli/runtime.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import type { TransferQueue } from "../../shared/store/types.ts";

/** A transfer queue that appends `<key> stored|dup [failed]` to `log` after every write. */
export function loggingStore(q: TransferQueue, log: string): TransferQueue {
  return {
    expectGroup: (u, n, p, fp) => q.expectGroup(u, n, p, fp),
    finishSession: (u, s, n) => q.finishSession(u, s, n),
    sessionRecords: (u, s) => q.sessionRecords(u, s),
    get: (k) => q.get(k),
    groupStatus: (u) => q.groupStatus(u),
    readCompleteGroups: (o) => q.readCompleteGroups(o),
    ack: (ids, p) => q.ack(ids, p),
    close: () => q.close(),
    put: async (r, o) => {
      const res = await q.put(r, o);
      appendFileSync(log, `${r.key} ${res.stored ? "stored" : "dup"}${r.error ? " failed" : ""}\n`);
      return res;
    },
    markFailed: async (k, reason, f) => {
      const res = await q.markFailed(k, reason, f);
      appendFileSync(log, `${k} ${res.stored ? "stored" : "dup"} failed\n`);
      return res;
    },
  };
}

async function main(): Promise<void> {
  const { values: v } = parseArgs({
    args: process.argv.slice(2),
    options: {
      store: { type: "string" },
      prefix: { type: "string" },
      engine: { type: "string" },
      tools: { type: "string" },
      consumer: { type: "string" },
      log: { type: "string" },
      concurrency: { type: "string", default: "16" },
      lease: { type: "string", default: "2" },
      "idle-exit": { type: "string", default: "3" },
      "max-model-len": { type: "string", default: "4096" },
    },
  });
  const log = v.log!;
  const runtime = await buildRuntime(
    { store: v.store!, storePrefix: v.prefix!, engine: v.engine!, tools: v.tools!, maxModelLen: Number(v["max-model-len"]), concurrency: Number(v.concurrency) },
    { wrapStore: (q) => loggingStore(q, log), jobQueue: { leaseMs: Math.round(Number(v.lease) * 1000) } },
  );
  try {
    const worker = new JobWorker({
      jobs: runtime.jobs!,
      store: runtime.batchStore,
      executorFor: runtime.executorFor,
      consumer: v.consumer!,
      concurrency: Number(v.concurrency),
      idleExitMs: Math.round(Number(v["idle-exit"]) * 1000),
      log: (line) => console.error(line),
      model: runtime.model,
    });
    process.once("SIGTERM", () => worker.stop());
    const summary = await worker.run();
    await runtime.jobs!.forgetConsumer(v.consumer!).catch(() => {});
    console.log(JSON.stringify({ consumer: v.consumer, ...summary }));
  } finally {
    await runtime.close();
  }
}

if (import.meta.main) {
  await main();
  process.exit(0);
}
