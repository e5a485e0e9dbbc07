import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError, TemplateError } from "../../../shared/errors.ts";
import { describeModel, modelIdOf } from "../../../shared/models/index.ts";
import type { ModelId } from "../../../shared/schema/index.ts";
import { ObservationEncoder } from "../../../shared/tokens/observation.ts";
import { tokenMethodFallbacks } from "../../../shared/tokens/token-methods.ts";
import type { ChatTokenizer } from "../../../shared/tokens/tokenizer.ts";
import { loadTokenizer } from "../../node/model-dir.ts";

/**
 * Loads the process's tokenizer (`model`: a built-in family or a model
 * directory; absent: the default), checks that its chat template renders
 * what every run needs ({@link probeTemplate}) and adds the `model` line
 * and one `tokens` line per token-formula fallback (issue 19) to `describe`.
 * @returns the tokenizer and its model id (`modelIdOf`).
 * @throws ConfigError (field `model`) when the template cannot render.
 */
export async function buildModel(config: AppConfig, describe: string[]): Promise<{ tokenizer: ChatTokenizer; model: ModelId }> {
  const tokenizer = await loadTokenizer(config.model ?? undefined);
  probeTemplate(tokenizer);
  const model = await modelIdOf(tokenizer);
  describe.push(`model      ${describeModel(tokenizer, config.rollout.multi_turn.format)}`);
  // Where the template falls back from token formulas to a render per prompt or observation (issue 19).
  for (const line of tokenMethodFallbacks(tokenizer, { chatTemplateKwargs: config.rollout.chat_template_kwargs })) describe.push(`tokens     ${line}`);
  return { tokenizer, model };
}

/**
 * Renders what every run needs once before anything starts — a first turn
 * with a tool declared, a tool result and a user turn as observations — so a
 * chat template that cannot (one that raises, or a model directory's Gemma
 * template without the built-in family's message shaping: "roles must
 * alternate") fails at start naming the model, not every trajectory later.
 * @throws ConfigError (field `model`) with the template's own message.
 */
function probeTemplate(tokenizer: ChatTokenizer): void {
  const tool = { type: "function" as const, function: { name: "probe", description: "probe", parameters: { type: "object" as const, properties: {} } } };
  const eot = tokenizer.stopTokenIds[0];
  const what = ["the first turn", "a tool result", "a user turn"];
  let step = 0;
  try {
    tokenizer.renderIds([{ role: "user", content: "ping" }], { tools: [tool], addGenerationPrompt: true });
    const enc = new ObservationEncoder(tokenizer);
    step = 1;
    enc.encode([{ role: "tool", content: "pong", name: "probe" }], eot);
    step = 2;
    enc.encode([{ role: "user", content: "pong" }], eot);
  } catch (e) {
    if (!(e instanceof TemplateError)) throw e;
    throw new ConfigError("model", `the chat template of ${tokenizer.name} cannot render ${what[step]}: ${e.message}`, { cause: e });
  }
}
