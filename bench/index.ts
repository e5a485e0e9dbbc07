/**
 * Runs the benchmarks: `npm run bench` runs all of them in sequence;
 * `npm run bench -- tokens routing` runs the named ones. Each is also
 * runnable alone: `bun bench/<name>.ts`. Results are printed as tables.
 */
import { readdirSync } from "node:fs";

const here = new URL(".", import.meta.url).pathname;
const all = readdirSync(here)
  .filter((f) => f.endsWith(".ts") && !["index.ts", "util.ts", "pause-engine.ts", "routing-setup.ts"].includes(f))
  .map((f) => f.replace(/\.ts$/, ""))
  .sort();
const wanted = process.argv.slice(2).filter((a) => !a.startsWith("-"));
const unknown = wanted.filter((w) => !all.includes(w));
if (unknown.length) {
  console.error(`unknown benchmark(s): ${unknown.join(", ")}; available: ${all.join(", ")}`);
  process.exit(2);
}
let failed = 0;
for (const name of wanted.length ? wanted : all) {
  console.log(`\n# bench/${name}.ts`);
  const p = Bun.spawnSync([process.execPath, `${here}${name}.ts`], { stdout: "inherit", stderr: "inherit" });
  if (p.exitCode !== 0) {
    console.error(`bench/${name}.ts exited with ${p.exitCode}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
