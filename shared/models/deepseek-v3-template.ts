/**
 * edgeloop's chat template for DeepSeek V3, in the packaged template's tool
 * format (`<｜tool▁calls▁begin｜>`, `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`,
 * `<｜tool▁outputs▁begin｜>`, `<｜tool▁output▁begin｜>…<｜tool▁output▁end｜>`, `<｜tool▁outputs▁end｜>`)
 * with the packaged template's faults fixed (checked in tests/models):
 * - one call alone is closed (`<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`;
 *   the packaged template closes only after a second call);
 * - call and output state is per message, not per conversation (the
 *   packaged template never resets it, so a second tool round renders
 *   without `<｜tool▁outputs▁begin｜>`);
 * - an assistant turn after tool outputs starts with `<｜tool▁outputs▁end｜>`
 *   whether it calls tools or answers (the packaged one writes
 *   `<｜Assistant｜>` before calls there, which is not append-only);
 * - text before calls is kept.
 * After tool outputs there is no `<｜Assistant｜>`: the model continues
 * after `<｜tool▁outputs▁end｜>`, as in the packaged template.
 * @see https://huggingface.co/deepseek-ai/DeepSeek-V3-0324/blob/main/tokenizer_config.json (the fixed upstream version)
 */
export const DEEPSEEK_V3_TOOL_TEMPLATE = [
  "{%- set ns = namespace(system_prompt='', is_first_sp=true, is_tool=false) %}",
  "{%- for message in messages %}{%- if message['role'] == 'system' %}",
  "{%- if ns.is_first_sp %}{%- set ns.system_prompt = message['content'] %}{%- set ns.is_first_sp = false %}",
  "{%- else %}{%- set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}",
  "{%- endif %}{%- endfor %}",
  "{{- bos_token }}{{- ns.system_prompt }}",
  "{%- for message in messages %}",
  "{%- if message['role'] == 'user' %}",
  "{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- set ns.is_tool = false %}{%- endif %}",
  "{{- '<｜User｜>' + message['content'] }}",
  "{%- elif message['role'] == 'assistant' %}",
  "{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- set ns.is_tool = false %}{%- else %}{{- '<｜Assistant｜>' }}{%- endif %}",
  "{%- if message['content'] %}{{- message['content'] }}{%- endif %}",
  "{%- if message['tool_calls'] %}",
  "{{- '<｜tool▁calls▁begin｜>' }}",
  "{%- for tool in message['tool_calls'] %}",
  "{%- if not loop.first %}{{- '\\n' }}{%- endif %}",
  "{{- '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments'] + '\\n```<｜tool▁call▁end｜>' }}",
  "{%- endfor %}",
  "{{- '<｜tool▁calls▁end｜>' }}",
  "{%- endif %}",
  "{{- '<｜end▁of▁sentence｜>' }}",
  "{%- elif message['role'] == 'tool' %}",
  "{%- if ns.is_tool %}{{- '\\n' }}{%- else %}{{- '<｜tool▁outputs▁begin｜>' }}{%- set ns.is_tool = true %}{%- endif %}",
  "{{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}",
  "{%- if add_generation_prompt and not ns.is_tool %}{{- '<｜Assistant｜>' }}{%- endif %}",
].join("");
