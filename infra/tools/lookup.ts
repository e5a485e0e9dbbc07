import { z } from "zod";
import defaultFactsJson from "./facts.json" with { type: "json" };

/** The fact table format of `facts.json`: topics with aliases and a one-sentence answer. */
export const FactTable = z.object({
  facts: z.array(z.object({ topic: z.string().min(1), aliases: z.array(z.string()).default([]), answer: z.string() })),
});
export type FactTable = z.infer<typeof FactTable>;

/** The fact table shipped in `infra/tools/facts.json`. */
export const DEFAULT_FACTS: FactTable = FactTable.parse(defaultFactsJson);

function normalise(s: string): string {
  return s.toLowerCase().replace(/[^a-z0-9' ]+/g, " ").replace(/\s+/g, " ").trim();
}

/**
 * Answers `query` from the fact table: an exact topic or alias match (case,
 * punctuation and spacing ignored) first, then the longest topic or alias of
 * at least 4 characters contained in the query ("what is the population of
 * paris?" finds "population of paris"). Unknown → a message listing the topics.
 */
export function lookupFact(query: string, table: FactTable = DEFAULT_FACTS): string {
  const q = normalise(query);
  let best: { len: number; answer: string } | undefined;
  for (const f of table.facts) {
    for (const name of [f.topic, ...f.aliases].map(normalise)) {
      if (name === q) return f.answer;
      if (name.length >= 4 && ` ${q} `.includes(` ${name} `) && (!best || name.length > best.len)) best = { len: name.length, answer: f.answer };
    }
  }
  if (best) return best.answer;
  return `No fact found for '${query}'. Known topics: ${table.facts.map((f) => f.topic).join(", ")}.`;
}
