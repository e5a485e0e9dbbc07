import type { ModelId } from "../schema/index.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";

const ids = new WeakMap<ChatTokenizer, Promise<ModelId>>();

/**
 * The {@link ModelId} of a loaded tokenizer: its name and 16 hex digits of
 * SHA-256 over {@link ChatTokenizer.fingerprintSource} (vocabulary size,
 * added and stop tokens, template text). Computed once per tokenizer object.
 */
export function modelIdOf(tok: ChatTokenizer): Promise<ModelId> {
  let p = ids.get(tok);
  if (!p) {
    p = crypto.subtle.digest("SHA-256", new TextEncoder().encode(tok.fingerprintSource())).then((d) => ({
      name: tok.name,
      fingerprint: Array.from(new Uint8Array(d).subarray(0, 8), (b) => b.toString(16).padStart(2, "0")).join(""),
    }));
    ids.set(tok, p);
  }
  return p;
}

/** `name (fingerprint)`, for messages that must tell two models apart. */
export function describeModelId(m: ModelId): string {
  return `${m.name} (fingerprint ${m.fingerprint})`;
}

/** True when two model ids name the same tokenizer and template (equal fingerprints; the name is informational). */
export function sameModel(a: ModelId, b: ModelId): boolean {
  return a.fingerprint === b.fingerprint;
}

/**
 * Why `tok` must not decode a record of `recorded`, or null when it may
 * (same fingerprint, or a record that names no model — written before
 * models were recorded — which is decoded as before).
 */
export function decodeRefusal(recorded: ModelId | undefined, own: ModelId): string | null {
  if (!recorded || sameModel(recorded, own)) return null;
  return `the record's tokens are of model ${describeModelId(recorded)}, this process has ${describeModelId(own)}: not decoded (decoding with another tokenizer gives garbage); decode where that model is loaded (e.g. --model ${recorded.name})`;
}
