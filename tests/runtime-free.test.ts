import { expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

// DESIGN §4 / CONVENTIONS: the core under shared/ uses Web-standard APIs only.
const FORBIDDEN = [
  /from\s+["'](bun|node|cloudflare):/,
  /import\s*\(\s*["'](bun|node|cloudflare):/,
  /require\s*\(\s*["'](bun|node|cloudflare):/,
  /from\s+["'](fs|path|net|os|crypto|child_process|ioredis)["']/,
  /\bBun\s*\./,
  /\bDeno\s*\./,
  /\bprocess\.(env|argv|exit|cwd|on|once|stdout|stderr|memoryUsage|hrtime|nextTick|platform|versions)\b/,
];

/** Comment lines (docstrings, `//`) may mention runtimes; code may not. */
const isComment = (line: string) => /^\s*(\*|\/\/|\/\*)/.test(line);

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? files(p) : p.endsWith(".ts") ? [p] : [];
  });
}

test("no file under shared/ imports a runtime or uses a runtime global", () => {
  const offenders: string[] = [];
  const all = files(join(import.meta.dir, "..", "shared"));
  expect(all.length).toBeGreaterThan(10);
  for (const f of all) {
    const text = readFileSync(f, "utf8");
    text.split("\n").forEach((line, i) => {
      if (!isComment(line) && FORBIDDEN.some((re) => re.test(line))) offenders.push(`${f}:${i + 1}: ${line.trim()}`);
    });
  }
  expect(offenders).toEqual([]);
});

test("the checker itself catches each forbidden form", () => {
  for (const line of ['import { x } from "bun:test";', 'import fs from "node:fs";', "const a = Bun.file('x');", "Deno.serve(h)", 'import R from "ioredis";', "process.env.X"]) {
    expect(FORBIDDEN.some((re) => re.test(line))).toBe(true);
  }
});
