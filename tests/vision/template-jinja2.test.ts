import { beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { QWEN3_VL_CHAT_TEMPLATE } from "../../shared/models/qwen3-vl.ts";
import { ChatMessage, type ToolSchema } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

// Qwen3-VL's template rendered by @huggingface/jinja (what edgeloop runs) equals Python Jinja2 with the settings of
// transformers' apply_chat_template (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, its tojson), image parts included.
// Needs Debian's python3-jinja2; skipped (with a warning) without it.
const PY = process.env.EDGELOOP_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
const jinja2 = Bun.spawnSync([PY, "-c", "import jinja2"], { stdout: "pipe", stderr: "pipe" }).exitCode === 0;
if (!jinja2) console.warn(`skipping the Jinja2 cross-check of Qwen3-VL's template: ${PY} cannot import jinja2 (apt-get install python3-jinja2)`);

const RENDER = `
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
d = json.loads(sys.stdin.read())
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(m):
    raise Exception(m)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
t = env.from_string(d["template"])
out = []
for c in d["cases"]:
    kw = {"messages": c["messages"], "add_generation_prompt": True}
    if c["tools"]:
        kw["tools"] = c["tools"]
    out.append(t.render(**kw))
print(json.dumps(out))
`;

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await builtinTokenizer("qwen3_vl");
});

const tools: ToolSchema[] = [{ type: "function", function: { name: "zoom", description: "Zoom in", parameters: { type: "object", properties: { factor: { type: "integer" } }, required: ["factor"] } } }];
const CONVERSATIONS = [
  [{ role: "user", content: [{ type: "image", image: "x" }, { type: "text", text: "What is this?" }] }],
  [
    { role: "system", content: "Be brief." },
    { role: "user", content: [{ type: "text", text: "a" }, { type: "image", image: "x" }, { type: "text", text: "b" }, { type: "image_url", image_url: { url: "y" } }] },
    { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "zoom", arguments: { factor: 2 } } }] },
    { role: "tool", tool_call_id: "c1", content: [{ type: "image", image: "z" }, { type: "text", text: "zoomed x2" }] },
    { role: "tool", tool_call_id: "c2", content: "plain" },
    { role: "assistant", content: "A red square. é ü" },
    { role: "user", content: "and now?" },
  ],
];

describe("Qwen3-VL's chat template", () => {
  test.skipIf(!jinja2)("renders as Python Jinja2 renders it (images, tools, a run of tool results, non-ASCII)", () => {
    const cases: { messages: unknown; tools: unknown; text: string }[] = [];
    for (const conv of CONVERSATIONS) {
      for (const t of [undefined, tools]) {
        const msgs = conv.map((m) => ChatMessage.parse(m));
        // What the template sees of an image part: {type: "image"} (normaliseForTemplate, keepImageParts).
        const seen = msgs.map((m) => Object.fromEntries(Object.entries({ ...m, content: Array.isArray(m.content) ? m.content.map((p) => (p.type === "text" ? p : { type: "image" })) : m.content }).filter(([, v]) => v !== undefined)));
        cases.push({ messages: seen, tools: t ?? null, text: tok.renderText(msgs, { tools: t, addGenerationPrompt: true }) });
      }
    }
    const run = Bun.spawnSync([PY, "-c", RENDER], { stdin: Buffer.from(JSON.stringify({ template: QWEN3_VL_CHAT_TEMPLATE, cases })), stdout: "pipe", stderr: "pipe" });
    expect(run.exitCode, run.stderr.toString()).toBe(0);
    expect(JSON.parse(run.stdout.toString())).toEqual(cases.map((c) => c.text));
    expect(cases[0]!.text).toBe("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n");
  });
});
