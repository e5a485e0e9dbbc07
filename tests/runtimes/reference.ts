import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { Services } from "./harness.ts";

/** The same batch run in this Bun process (memory store, plain executor): the records every runtime must match. */
export async function bunReference(s: Services, rows: Record<string, unknown>[]): Promise<Map<string, TrajectoryRecord>> {
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-ref-"));
  const toolsFile = join(dir, "tools.json");
  writeFileSync(toolsFile, s.toolsJson);
  const rt = await buildRuntime({ engine: s.engine.urls[0], tools: toolsFile, toolsSecret: "runtime-secret", n: 2, seed: 7, maxModelLen: 4096, promptLength: 512, responseLength: 512 });
  try {
    const { run } = rt.service.submit({ rows, global_steps: -1, model_version: null, validate: false });
    await run.run();
    return new Map(run.records().map((r) => [r.key, r]));
  } finally {
    await rt.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
