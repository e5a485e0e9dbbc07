import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { resolveSelfImport, rewriteSelfImports } from "../infra/cli/self-imports.ts";

// Issue 28 item 4: the public API is the `exports` map — named entry points, each a documented module;
// every `edgeloop/...` import the README and docs/ show resolves through it; nothing else is exported.
const ROOT = join(import.meta.dir, "..");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { name: string; exports: Record<string, string> };
const docs = ["README.md", ...readdirSync(join(ROOT, "docs")).filter((f) => f.endsWith(".md")).map((f) => join("docs", f))];

/** Every `edgeloop` / `edgeloop/<x>` specifier of an import or export statement in fenced code blocks of `markdown`. */
function documentedImports(markdown: string): string[] {
  const out: string[] = [];
  for (const [, code] of markdown.matchAll(/```(?:ts|js|typescript|javascript)\n([\s\S]*?)```/g)) {
    for (const m of code!.matchAll(/(?:\bfrom|\bimport)\s*\(?\s*["'](edgeloop(?:\/[^"'\s]*)?)["']/g)) out.push(m[1]!);
  }
  return out;
}

describe("the public API (package.json exports, docs/architecture.md)", () => {
  test("exports names the entry points of docs/architecture.md's table, in its order, and nothing else (no wildcard)", () => {
    const arch = readFileSync(join(ROOT, "docs", "architecture.md"), "utf8");
    const table = arch.slice(arch.indexOf("<!-- exports:"));
    const rows = [...table.matchAll(/^\| `edgeloop\/([a-z-]+)` \| `([^`]+)` \|/gm)].map((m) => [`./${m[1]}`, `./${m[2]}`] as [string, string]);
    expect(rows.length).toBe(8);
    expect(Object.entries(pkg.exports)).toEqual([...rows, ["./package.json", "./package.json"]]);
  });

  test("each entry file exists and opens with a docstring saying what it holds", () => {
    for (const [key, file] of Object.entries(pkg.exports)) {
      expect([key, existsSync(join(ROOT, file))]).toEqual([key, true]);
      if (key === "./package.json") continue;
      const src = readFileSync(join(ROOT, file), "utf8");
      const doc = /^\/\*\*([\s\S]*?)\*\//.exec(src.replace(/^(?:import [^\n]*\n)+\n?/, ""))?.[1] ?? "";
      // The module's own docstring (before or right after its imports) says what it is; the entry files written for
      // the map name their import.
      expect([key, doc.length > 80]).toEqual([key, true]);
    }
  });

  test("every edgeloop/... import in the README and docs/ resolves through exports, and imports", async () => {
    const seen = new Set<string>();
    for (const f of docs) for (const spec of documentedImports(readFileSync(join(ROOT, f), "utf8"))) seen.add(spec);
    expect([...seen].sort()).toEqual(["edgeloop/agent-loop", "edgeloop/schema", "edgeloop/worker"]);
    for (const spec of seen) {
      expect([spec, resolveSelfImport(spec, pkg.exports) !== null]).toEqual([spec, true]);
      // Package self-reference: inside the repository `edgeloop/<entry>` resolves through the same map.
      if (spec !== "edgeloop/worker") expect(Object.keys(await import(spec)).length).toBeGreaterThan(5);
    }
    const sdk = await import("edgeloop/agent-loop");
    for (const name of ["AgentLoop", "emptyMetrics", "addPreempted", "buildPromptIds", "ObservationEncoder", "TrajectoryBuilder", "defaultAgentLoopRegistry", "parseAgentLoopConfig", "runAgentLoop", "defaultTokenizer"]) expect([name, typeof (sdk as Record<string, unknown>)[name]]).toEqual([name, "function"]);
  });

  test("a deep import is not an entry point: refused naming the entry points", () => {
    expect(resolveSelfImport("edgeloop/shared/agent-loop/agent-loop.ts", pkg.exports)).toBeNull();
    expect(resolveSelfImport("edgeloop/agent-loop", pkg.exports, "/pkg")).toBe("/pkg/shared/sdk/agent-loop.ts");
    expect(rewriteSelfImports(`import { A } from "edgeloop/agent-loop";\nexport * from 'edgeloop/schema';\nconst w = await import("edgeloop/worker");\nconst s = "edgeloop/sim-qwen3";`, pkg.exports, "/pkg")).toBe(
      `import { A } from "/pkg/shared/sdk/agent-loop.ts";\nexport * from '/pkg/shared/schema/index.ts';\nconst w = await import("/pkg/infra/cloudflare/worker.ts");\nconst s = "edgeloop/sim-qwen3";`,
    );
    expect(() => rewriteSelfImports(`import { x } from "edgeloop/shared/errors.ts";`, pkg.exports)).toThrow(
      "'edgeloop/shared/errors.ts' is not an entry point of edgeloop (package.json exports): import one of edgeloop/agent-loop, edgeloop/schema, edgeloop/models, edgeloop/engines, edgeloop/transfer-queue, edgeloop/functions, edgeloop/worker, edgeloop/sim-engine",
    );
  });
});
