import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SimEngine } from "../../infra/sim-engine/index.ts";
import { readSimScriptFile } from "../../infra/sim-engine/script-file.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

// Sim script rule variants (the n samples of a prompt differ, so dynamic sampling has groups to keep) and
// script files extending another (examples/policy-dapo.json over examples/policy.json).
const EOS = 151645;
let tok: ChatTokenizer;
const dir = mkdtempSync(join(tmpdir(), "edgeloop-simvar-"));
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const SCRIPT = { seed: 3, rules: [{ when: "pick", turns: ["A"], variants: [["B"], ["C"]] }], default: ["none"] };
const prompt = () => tok.encode("<|im_start|>user\nplease pick one<|im_end|>\n<|im_start|>assistant\n");
async function answer(engine: SimEngine, routingKey: string | undefined): Promise<string> {
  const out = await engine.generate({ request_id: crypto.randomUUID(), ...(routingKey ? { routing_key: routingKey } : {}), prompt_ids: prompt(), max_tokens: 16, stop_token_ids: [EOS] });
  expect(out.token_ids.at(-1)).toBe(EOS);
  return tok.decode(out.token_ids.slice(0, -1));
}

describe("rule variants", () => {
  test("each session index plays one list, whatever the uid; every list is played across sessions; no key plays turns", async () => {
    const engine = new SimEngine({ tokenizer: tok, script: SCRIPT });
    const byIndex: string[] = [];
    for (let s = 0; s < 12; s++) byIndex.push(await answer(engine, `uid-one_${s}_0`));
    // The draw ignores the uid: another uid's sessions play the same lists (a rerun with fresh uids repeats).
    for (let s = 0; s < 12; s++) expect(await answer(engine, `3f2a9c1e-other_${s}_0`)).toBe(byIndex[s]!);
    expect(new Set(byIndex)).toEqual(new Set(["A", "B", "C"]));
    expect(await answer(engine, undefined)).toBe("A");
    expect(await answer(engine, "not-a-trajectory-key")).toBe("A");
    // Another seed draws otherwise for at least one of the 12 sessions.
    const other = new SimEngine({ tokenizer: tok, script: { ...SCRIPT, seed: 4 } });
    const byIndex4: string[] = [];
    for (let s = 0; s < 12; s++) byIndex4.push(await answer(other, `u_${s}_0`));
    expect(byIndex4).not.toEqual(byIndex);
  });
});

describe("script files: extends", () => {
  test("the file's keys over its base's; its rules first (they win), then the base's", async () => {
    writeFileSync(join(dir, "base.json"), JSON.stringify({ seed: 1, rules: [{ when: "x", turns: ["base x"] }, { when: "y", turns: ["base y"] }], default: ["d"] }));
    writeFileSync(join(dir, "top.json"), JSON.stringify({ extends: "base.json", seed: 9, rules: [{ when: "x", turns: ["top x"] }] }));
    expect(await readSimScriptFile(join(dir, "top.json"))).toEqual({
      seed: 9,
      default: ["d"],
      rules: [{ when: "x", turns: ["top x"] }, { when: "x", turns: ["base x"] }, { when: "y", turns: ["base y"] }],
    });
  });
  test("a cycle, a non-string extends and a missing base are errors naming the file", async () => {
    writeFileSync(join(dir, "a.json"), JSON.stringify({ extends: "b.json" }));
    writeFileSync(join(dir, "b.json"), JSON.stringify({ extends: "a.json" }));
    expect((await readSimScriptFile(join(dir, "a.json")).catch((e) => e)).message).toBe(`extends cycle: ${join(dir, "a.json")} -> ${join(dir, "b.json")} -> ${join(dir, "a.json")}`);
    writeFileSync(join(dir, "n.json"), JSON.stringify({ extends: 3 }));
    expect((await readSimScriptFile(join(dir, "n.json")).catch((e) => e)).message).toBe(`${join(dir, "n.json")}: extends must be a file path (a string)`);
    writeFileSync(join(dir, "m.json"), JSON.stringify({ extends: "missing.json" }));
    expect((await readSimScriptFile(join(dir, "m.json")).catch((e) => e)).message).toContain("missing.json");
  });
  test("examples/policy-dapo.json: 10 of policy.json's prompts get a wrong-answer variant; the rest is policy.json's", async () => {
    const root = join(import.meta.dir, "..", "..", "examples");
    const base = JSON.parse(readFileSync(join(root, "policy.json"), "utf8")) as { rules: { when: string; turns: unknown[] }[] };
    const dapo = (await readSimScriptFile(join(root, "policy-dapo.json"))) as { rules: { when: string; turns: unknown[]; variants?: unknown[][] }[] };
    expect(dapo.rules.length).toBe(base.rules.length + 10);
    const own = dapo.rules.slice(0, 10);
    for (const r of own) {
      const b = base.rules.find((x) => x.when === r.when)!;
      expect(r.turns).toEqual(b.turns);
      expect(r.variants!.length).toBe(1);
      expect(r.variants![0]!.slice(0, -1)).toEqual(b.turns.slice(0, -1));
      expect(r.variants![0]!.at(-1)).not.toEqual(b.turns.at(-1));
    }
    expect(dapo.rules.slice(10)).toEqual(base.rules);
  });
});
