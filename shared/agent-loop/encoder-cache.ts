import { LRUCache } from "lru-cache";
import type { ToolSchema } from "../schema/index.ts";
import { ObservationEncoder } from "../tokens/observation.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";

/** Most distinct (tools, template kwargs) encoders kept per tokenizer. */
const MAX_PER_TOKENIZER = 64;

const byTokenizer = new WeakMap<ChatTokenizer, LRUCache<string, ObservationEncoder>>();
const schemaKeys = new WeakMap<readonly ToolSchema[], string>();

/** The JSON of a tools list, computed once per list object. */
function toolsKey(tools: readonly ToolSchema[] | undefined): string {
  if (!tools || tools.length === 0) return "";
  let k = schemaKeys.get(tools);
  if (k === undefined) {
    k = JSON.stringify(tools);
    schemaKeys.set(tools, k);
  }
  return k;
}

/**
 * The observation encoder for `tok` with `tools` (rendered into the prompt,
 * in prompt order; empty or absent = none) and `chatTemplateKwargs`, shared
 * by every trajectory with the same three: an encoder's state is what it
 * derives once from the template (the turn separator, synthetic histories),
 * a function of exactly these inputs, so sharing it changes no id while the
 * derivation (template renders) runs once per process instead of once per
 * trajectory. Keyed by the tokenizer object (weakly), the tools' JSON and
 * the kwargs' JSON; at most {@link MAX_PER_TOKENIZER} encoders per
 * tokenizer (least recently used dropped).
 */
export function sharedObservationEncoder(
  tok: ChatTokenizer,
  tools: readonly ToolSchema[] | undefined,
  chatTemplateKwargs: Record<string, unknown> | undefined,
): ObservationEncoder {
  let cache = byTokenizer.get(tok);
  if (!cache) {
    cache = new LRUCache({ max: MAX_PER_TOKENIZER });
    byTokenizer.set(tok, cache);
  }
  const key = `${toolsKey(tools)}\u0000${chatTemplateKwargs ? JSON.stringify(chatTemplateKwargs) : ""}`;
  let enc = cache.get(key);
  if (!enc) {
    enc = new ObservationEncoder(tok, { tools: tools && tools.length > 0 ? tools : undefined, chatTemplateKwargs });
    cache.set(key, enc);
  }
  return enc;
}
