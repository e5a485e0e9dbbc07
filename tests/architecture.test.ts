import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, normalize, relative, sep } from "node:path";

// Issue 28: the layers of shared/ as docs/architecture.md lists them, checked against the code's imports.
const ROOT = join(import.meta.dir, "..");
const SHARED = join(ROOT, "shared");

/** Layer number of each folder (or top-level file, without `.ts`) of shared/, parsed from docs/architecture.md's numbered list. */
export function parseLayers(markdown: string): Map<string, number> {
  const start = markdown.indexOf("<!-- layers:");
  if (start < 0) throw new Error("docs/architecture.md has no '<!-- layers:' marker");
  const layers = new Map<string, number>();
  for (const line of markdown.slice(start).split("\n").slice(1)) {
    const m = /^(\d+)\. ((?:`[a-z0-9-]+`(?:, )?)+) — /.exec(line);
    if (!m) {
      if (layers.size > 0 && line.trim() === "") break;
      continue;
    }
    for (const [, name] of m[2]!.matchAll(/`([a-z0-9-]+)`/g)) layers.set(name!, Number(m[1]));
  }
  return layers;
}

/** Every relative module specifier `file` imports: `import … from`, `export … from`, `import "…"`, `import("…")`. */
export function importsOf(source: string): string[] {
  const out: string[] = [];
  const re = /(?:^|[\s;])(?:import|export)\s[^;"'`]*?from\s*["'](\.{1,2}\/[^"']+)["']|(?:^|[\s;])import\s*["'](\.{1,2}\/[^"']+)["']|import\(\s*["'](\.{1,2}\/[^"']+)["']\s*[,)]/g;
  for (const m of source.matchAll(re)) out.push((m[1] ?? m[2] ?? m[3])!);
  return out;
}

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? tsFiles(p) : n.endsWith(".ts") ? [p] : [];
  });
}

/** The shared/ unit a path belongs to: its first folder, or a top-level file's name without `.ts`. */
function unitOf(file: string): string {
  const parts = relative(SHARED, file).split(sep);
  return parts.length > 1 ? parts[0]! : parts[0]!.replace(/\.ts$/, "");
}

/** One cycle of the import graph (as file paths, closed), or null: depth-first search with colours. */
export function findCycle(graph: Map<string, string[]>): string[] | null {
  const colour = new Map<string, 1 | 2>();
  const stack: string[] = [];
  const visit = (n: string): string[] | null => {
    colour.set(n, 1);
    stack.push(n);
    for (const m of graph.get(n) ?? []) {
      if (colour.get(m) === 1) return [...stack.slice(stack.indexOf(m)), m];
      if (!colour.has(m)) {
        const c = visit(m);
        if (c) return c;
      }
    }
    stack.pop();
    colour.set(n, 2);
    return null;
  };
  for (const n of graph.keys()) if (!colour.has(n)) {
    const c = visit(n);
    if (c) return c;
  }
  return null;
}

describe("the layers of shared/ (docs/architecture.md)", () => {
  const layers = parseLayers(readFileSync(join(ROOT, "docs", "architecture.md"), "utf8"));
  const files = tsFiles(SHARED);
  const graph = new Map<string, string[]>();
  for (const f of files) {
    const targets = importsOf(readFileSync(f, "utf8")).map((spec) => normalize(join(dirname(f), spec)));
    graph.set(f, targets);
  }
  const rel = (p: string) => relative(ROOT, p);

  test("the list names thirteen layers, and every folder and top-level file of shared/ is in it", () => {
    expect(Math.max(...layers.values())).toBe(13);
    const units = [...new Set(files.map(unitOf))].sort();
    expect(units.filter((u) => !layers.has(u))).toEqual([]);
    expect([...layers.keys()].filter((u) => !units.includes(u))).toEqual([]);
  });

  test("shared/ imports nothing outside itself but packages (no functions/, infra/, tests/)", () => {
    const outside = [...graph].flatMap(([f, ts]) => ts.filter((t) => !t.startsWith(SHARED + sep)).map((t) => `${rel(f)} -> ${rel(t)}`));
    expect(outside).toEqual([]);
  });

  test("every import resolves to a file of shared/", () => {
    const missing = [...graph].flatMap(([f, ts]) => ts.filter((t) => !graph.has(t)).map((t) => `${rel(f)} -> ${rel(t)}`));
    expect(missing).toEqual([]);
  });

  test("no import runs into a higher layer", () => {
    const up = [...graph].flatMap(([f, ts]) =>
      ts.filter((t) => graph.has(t) && layers.get(unitOf(t))! > layers.get(unitOf(f))!).map((t) => `${rel(f)} (${unitOf(f)}, layer ${layers.get(unitOf(f))}) -> ${rel(t)} (${unitOf(t)}, layer ${layers.get(unitOf(t))})`),
    );
    expect(up).toEqual([]);
  });

  test("no import cycle, between files or between folders", () => {
    const cycle = findCycle(graph);
    expect(cycle?.map(rel) ?? null).toBeNull();
    const units = new Map<string, string[]>();
    for (const [f, ts] of graph) {
      const u = unitOf(f);
      units.set(u, [...new Set([...(units.get(u) ?? []), ...ts.filter((t) => graph.has(t)).map(unitOf).filter((x) => x !== u)])]);
    }
    expect(findCycle(units)).toBeNull();
  });

  test("the checks catch what they exist for: an up-layer import, a cycle, an unlisted folder", () => {
    expect(findCycle(new Map([["a", ["b"]], ["b", ["c"]], ["c", ["a"]]]))).toEqual(["a", "b", "c", "a"]);
    expect(findCycle(new Map([["a", ["b"]], ["b", ["c"]], ["c", []]]))).toBeNull();
    expect(importsOf(`import { x } from "../rollout/batch.ts";\nexport * from "./y.ts";\nimport type { Z } from "../z.ts";\nconst m = await import("./lazy.ts");\nimport "./side.ts";\nimport { z } from "zod";`)).toEqual(["../rollout/batch.ts", "./y.ts", "../z.ts", "./lazy.ts", "./side.ts"]);
    const parsed = parseLayers("x\n<!-- layers: -->\n1. `errors` — e.\n2. `schema`, `http` — s.\n\nafter\n3. `late` — no.");
    expect([...parsed]).toEqual([["errors", 1], ["schema", 2], ["http", 2]]);
  });
});
