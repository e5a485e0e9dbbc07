import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync, copyFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError } from "../../shared/errors.ts";
import { BUILTIN_MODELS, builtinTokenizer, describeModel } from "../../shared/models/index.ts";
import { loadTokenizer } from "../../infra/node/model-dir.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const ROOT = join(import.meta.dir, "..", "..");

describe("built-in model families", () => {
  test("names", () => {
    expect([...BUILTIN_MODELS]).toEqual(["qwen3", "llama3_1", "deepseek_v3", "gpt_oss", "gemma3", "qwen3_vl"]);
  });

  test("each family: end-of-turn token, stop ids from its generation config, turn-end ids, parser, history policy", async () => {
    const rows: unknown[] = [];
    for (const name of ["qwen3", "llama3_1", "deepseek_v3", "gemma3"]) {
      const t = await builtinTokenizer(name);
      rows.push([name, t.eosText(), t.eosTokenId, [...t.stopTokenIds], [...t.turnEndIds], t.traits.defaultParser, t.traits.historyPolicy, t.traits.toolResultRole]);
    }
    expect(rows).toEqual([
      ["qwen3", "<|im_end|>", 151645, [151645, 151643], [151645], "hermes", "rewrites-history", "tool"],
      ["llama3_1", "<|eot_id|>", 128009, [128009, 128001, 128008], [128009, 128008], "llama3_json", "append-only", "ipython"],
      ["deepseek_v3", "<｜end▁of▁sentence｜>", 1, [1], [1], "deepseek_v3", "append-only", "tool"],
      ["gemma3", "<end_of_turn>", 106, [106, 1], [106], "pythonic", "append-only", "user"],
    ]);
  }, HANG_MS);

  test("qwen3 by name is the default tokenizer (one cache entry)", async () => {
    expect(await builtinTokenizer("qwen3")).toBe(await defaultTokenizer());
    expect(await loadTokenizer("qwen3")).toBe(await defaultTokenizer());
    expect(await loadTokenizer(undefined)).toBe(await defaultTokenizer());
  });

  test("Llama 3.1 special tokens carry their 3.1 names (the package ships Llama 3's reserved names)", async () => {
    const t = await builtinTokenizer("llama3_1");
    expect([t.tokenId("<|eom_id|>"), t.tokenId("<|python_tag|>"), t.tokenId("<|finetune_right_pad_id|>")]).toEqual([128008, 128010, 128004]);
    expect(t.encode("<|eom_id|><|eot_id|>")).toEqual([128008, 128009]);
    expect(t.tokenId("<|reserved_special_token_4|>")).toBeUndefined();
  });

  test("gpt_oss loads with our harmony template, its generation-config stop ids and the harmony parser", async () => {
    const t = await loadTokenizer("gpt_oss");
    expect(t).toBe(await builtinTokenizer("gpt_oss"));
    expect(describeModel(t)).toBe("gpt_oss (end of turn <|return|> 200002; stop ids 200002, 199999, 200012; parser harmony; history rewrites-history)");
    expect(t.turnEndIds).toEqual([200002, 200012, 200007]);
    expect(t.renderText([{ role: "user", content: "Hi" }], { addGenerationPrompt: true }).endsWith("<|start|>user<|message|>Hi<|end|><|start|>assistant")).toBe(true);
  });

  test("the start line names model, end-of-turn token, stop ids and parser", async () => {
    expect(describeModel(await builtinTokenizer("llama3_1"))).toBe(
      "llama3_1 (end of turn <|eot_id|> 128009; stop ids 128009, 128001, 128008; parser llama3_json; history append-only)",
    );
    expect(describeModel(await builtinTokenizer("gemma3"), "hermes")).toBe(
      "gemma3 (end of turn <end_of_turn> 106; stop ids 106, 1; parser hermes; history append-only)",
    );
  });

  test("a model directory wins: its chat_template.jinja over the config's template, its generation_config stop ids", async () => {
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-model-"));
    const pkg = join(ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
    copyFileSync(join(pkg, "tokenizer.json"), join(dir, "tokenizer.json"));
    copyFileSync(join(pkg, "tokenizer_config.json"), join(dir, "tokenizer_config.json"));
    writeFileSync(join(dir, "chat_template.jinja"), "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}");
    writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [1] }));
    const t = await loadTokenizer(dir);
    expect(t.renderText([{ role: "user", content: "hi" }, { role: "user", content: "again" }])).toBe("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n");
    expect([...t.stopTokenIds]).toEqual([106, 1]);
    expect(t.traits.family).toBe("custom");
    expect(t.traits.defaultParser).toBe("hermes");
  }, HANG_MS);

  test("an unknown name that is no directory: ConfigError naming model", async () => {
    const err = await loadTokenizer("llama9").catch((e) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).field).toBe("model");
  });
});

describe("the Worker build (only Qwen3 is bundled)", () => {
  test("a config naming another model is refused with a ConfigError, never run with Qwen3 tokens", async () => {
    const { workerRuntime } = await import("../../infra/cloudflare/env.ts");
    const env = {
      UPSTASH_REDIS_REST_URL: "http://127.0.0.1:1",
      UPSTASH_REDIS_REST_TOKEN: "t",
      EDGELOOP_ENGINE_URL: "http://127.0.0.1:2",
      EDGELOOP_CONFIG: JSON.stringify({ model: "llama3_1" }),
    } as unknown as Parameters<typeof workerRuntime>[0];
    const err = await workerRuntime(env).catch((e) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).field).toBe("model");
    expect((err as Error).message).toBe(
      "config model: the Worker build bundles only the qwen3 tokenizer; 'llama3_1' runs with the CLI (edgeloop serve/worker --model llama3_1)",
    );
  });
});

test("decode is the sampled text exactly: no clean_up_tokenization_spaces (Llama 3.1 sets it), so tool arguments keep ' , ' and ' !'", async () => {
  const { builtinTokenizer } = await import("../../shared/models/index.ts");
  for (const name of ["llama3_1", "qwen3", "gemma3"] as const) {
    const tok = await builtinTokenizer(name);
    const text = `{"query": "x , y ! z ? do n't it 's"}`;
    expect([name, tok.decode(tok.encode(text))]).toEqual([name, text]);
  }
});
