import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

// The README states the Node version below which `npm install` warns (EBADENGINE) and which packages
// cause it: the highest minimum a runtime dependency in the lockfile declares must be the one it names.
const ROOT = join(import.meta.dir, "..", "..");

test("the README names the highest Node minimum of the runtime dependencies (EBADENGINE below it)", () => {
  const lock = JSON.parse(readFileSync(join(ROOT, "package-lock.json"), "utf8")) as { packages: Record<string, { engines?: { node?: string }; dev?: boolean; optional?: boolean }> };
  let highest = [0, 0, 0];
  const at: string[] = [];
  for (const [path, p] of Object.entries(lock.packages)) {
    if (!path || p.dev || p.optional || !p.engines?.node) continue;
    // The lower bound of the range's last alternative (`20 || >=22` → 22; `>=22.15.0` → 22.15.0).
    const m = /(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$/.exec(p.engines.node.split("||").at(-1)!.replace(/[\^~>=<\s]/g, " "));
    if (!m) continue;
    const v = [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)];
    const cmp = v[0]! - highest[0]! || v[1]! - highest[1]! || v[2]! - highest[2]!;
    if (cmp > 0) [highest, at.length] = [v, 0];
    if (cmp >= 0) at.push(path.replace(/^.*node_modules\//, ""));
  }
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  expect(`${highest[0]}.${highest[1]}`).toBe("22.15");
  expect(readme).toContain("On Node older than 22.15 `npm install` prints `EBADENGINE` warnings for the OpenTelemetry 3.x packages");
  expect(at.every((p) => p.startsWith("@opentelemetry/"))).toBe(true);
});
