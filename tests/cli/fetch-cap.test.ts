import { expect, test } from "bun:test";
import { buildRuntime, fetchCapWarning } from "../../infra/cli/runtime.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Bun queues fetches beyond BUN_CONFIG_MAX_HTTP_REQUESTS (256 unset) inside the process: with more trajectories in
// flight, a pause call waits for a generation call to end. The start lines say so when `concurrency` exceeds the cap.

test("fetchCapWarning: concurrency over the cap (256 unset, else the variable) is a warning naming both; at or under it, none", () => {
  expect(fetchCapWarning(256, {})).toBeNull();
  expect(fetchCapWarning(257, {})).toBe(
    "warning    concurrency 257 exceeds Bun's cap of 256 simultaneous HTTP requests (BUN_CONFIG_MAX_HTTP_REQUESTS unset): engine, tool, store and pause calls beyond it queue inside this process; run through `npx edgeloop` (sets 4096) or set the variable",
  );
  expect(fetchCapWarning(4096, { BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" })).toBeNull();
  expect(fetchCapWarning(5000, { BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" })).toContain("concurrency 5000 exceeds Bun's cap of 4096 simultaneous HTTP requests (BUN_CONFIG_MAX_HTTP_REQUESTS)");
  expect(fetchCapWarning(300, { BUN_CONFIG_MAX_HTTP_REQUESTS: "lots" })).toContain("cap of 256");
});

test("buildRuntime lists the warning among its start-up warnings", async () => {
  const cap = Number(process.env.BUN_CONFIG_MAX_HTTP_REQUESTS || 256);
  const over = await buildRuntime({ concurrency: cap + 1 });
  const under = await buildRuntime({ concurrency: 8 });
  try {
    expect(over.warnings.filter((w) => w.includes("simultaneous HTTP requests"))).toEqual([fetchCapWarning(cap + 1)!]);
    expect(under.warnings.filter((w) => w.includes("simultaneous HTTP requests"))).toEqual([]);
  } finally {
    await over.close();
    await under.close();
  }
}, HANG_MS);
