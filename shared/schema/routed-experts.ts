import { z } from "zod";

/**
 * Value recorded at positions of `prompt ‖ response` that no engine call
 * covered with routed experts (the last sampled token, which is never
 * forwarded; observations after the last engine call). 0, as verl's agent
 * loop pads `routed_experts` (`torch.zeros(1, total_length, layers, top_k)`
 * around the engine's rows) and as edgeloop's Python reader pads.
 * @see verl `verl/experimental/agent_loop/agent_loop.py` (`_postprocess`, routed_experts)
 */
export const ROUTED_EXPERTS_FILL = 0;

/** `[layers, top_k]`: MoE layers reported per token, experts per token and layer. */
export const RoutedExpertsShape = z.tuple([z.number().int().min(1), z.number().int().min(1)]);
export type RoutedExpertsShape = z.infer<typeof RoutedExpertsShape>;

/**
 * The routed experts one engine call returned: `data` is int32 row-major
 * `[tokens, layers, top_k]` (`shape` = `[layers, top_k]`) for positions
 * `start .. start + tokens − 1` of the call's input ‖ output (position 0 =
 * the first id of the request's `prompt_ids`, which is the trajectory's
 * prompt start since every call re-sends the whole running stream).
 * SGLang covers `prompt ‖ output` except the last output token (it is
 * sampled, never forwarded): `start = 0`, `tokens = P + C − 1`.
 * @see SGLang `RoutedExpertsCapturer.get_routed_experts` (`req_to_token[: seqlen - 1]`)
 */
export const RoutedExpertsSpan = z
  .object({
    data: z.custom<Int32Array>((v) => v instanceof Int32Array, "expected an Int32Array"),
    shape: RoutedExpertsShape,
    start: z.number().int().min(0),
    tokens: z.number().int().min(0),
  })
  .refine((s) => s.data.length === s.tokens * s.shape[0] * s.shape[1], {
    message: "routed_experts.data must hold tokens × layers × top_k values",
    path: ["data"],
  });
export type RoutedExpertsSpan = z.infer<typeof RoutedExpertsSpan>;

/**
 * The first `[layers, top_k]` row of `data` (int32 row-major `[tokens, layers,
 * top_k]`) that names one expert twice, or undefined. A router's top-k picks
 * `top_k` distinct experts per token and layer, so a repeat means the shape
 * used to read the flat array is wrong (e.g. `engine.moe` transposed: `[2, 4]`
 * for a `[4, 2]` model reads across layers). Rows whose values are all equal
 * are skipped: that is a fill (verl's zeros), not a router's pick. Linear in
 * `data.length` (each row's check is O(top_k²) for top_k ≤ 32, else a set).
 * @see SGLang `topk` / vLLM `FusedMoE.select_experts` (`torch.topk` over the router's logits: distinct indices)
 */
export function firstRepeatedExpert(data: ArrayLike<number>, shape: RoutedExpertsShape): { token: number; layer: number; expert: number } | undefined {
  const [layers, k] = shape;
  if (k < 2) return undefined;
  const rows = Math.floor(data.length / k);
  for (let r = 0; r < rows; r++) {
    const o = r * k;
    const first = data[o]!;
    let allEqual = true;
    for (let j = 1; j < k; j++) if (data[o + j] !== first) allEqual = false;
    if (allEqual) continue;
    let repeated: number | undefined;
    if (k <= 32) {
      for (let i = 1; i < k && repeated === undefined; i++) {
        for (let j = 0; j < i; j++) {
          if (data[o + i] === data[o + j]) {
            repeated = data[o + i];
            break;
          }
        }
      }
    } else {
      const seen = new Set<number>();
      for (let j = 0; j < k; j++) {
        const v = data[o + j]!;
        if (seen.has(v)) {
          repeated = v;
          break;
        }
        seen.add(v);
      }
    }
    if (repeated !== undefined) return { token: Math.floor(r / layers), layer: r % layers, expert: repeated };
  }
  return undefined;
}
