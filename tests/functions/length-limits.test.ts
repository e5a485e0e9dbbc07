import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 / audit S18: a batch's rollout.prompt_length and rollout.response_length are bounded by the
// server's limits.max_prompt_length / limits.max_response_length (default 131072 each): more is a 400 naming the field.

const runtimes: Runtime[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
});

const dir = mkdtempSync(join(tmpdir(), "edgeloop-s18-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function rawApp(config?: unknown) {
  let path: string | undefined;
  if (config) {
    path = join(dir, `config-${runtimes.length}.json`);
    writeFileSync(path, JSON.stringify(config));
  }
  const rt = await buildRuntime({ n: 1, seed: 7, ...(path ? { config: path } : {}) });
  runtimes.push(rt);
  const a = createRolloutsApp({ service: rt.service });
  return { rt, post: (body: unknown) => a.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }) };
}

async function app() {
  const { post } = await rawApp();
  return (rollout: unknown) => post({ rows: [{ prompt: [{ role: "user", content: "hello" }] }], config: { rollout } });
}

describe("S18: per-batch lengths within the server's limits", () => {
  test("the audit's repro (prompt_length 2,000,000; response_length 1e12) is a 400 naming the field, before anything is planned", async () => {
    const post = await app();
    const a = await post({ n: 8, prompt_length: 2_000_000 });
    expect([a.status, await a.json()]).toEqual([
      400,
      { error: { code: "invalid_config", message: "config rollout.prompt_length: must be <= limits.max_prompt_length 131072 (in request config)", field: "rollout.prompt_length" } },
    ]);
    const b = await post({ response_length: 1e12 });
    expect([b.status, await b.json()]).toEqual([
      400,
      { error: { code: "invalid_config", message: "config rollout.response_length: must be <= limits.max_response_length 131072 (in request config)", field: "rollout.response_length" } },
    ]);
    // At the limit is accepted.
    expect((await post({ prompt_length: 131_072, response_length: 131_072, max_model_len: 262_145 })).status).toBe(202);
  });

  test("the operator sets the maxima; a server config over its own maxima is refused at start", () => {
    expect(parseAppConfig({ limits: { max_prompt_length: 2_000_000 }, rollout: { prompt_length: 2_000_000 } }).rollout.prompt_length).toBe(2_000_000);
    expect(() => parseAppConfig({ limits: { max_response_length: 1024 }, rollout: { response_length: 2048 } })).toThrow("config rollout.response_length: must be <= limits.max_response_length 1024 (in config)");
  });
});

describe("S18: a huge prompt is refused before tokenizing, and each row is tokenized once", () => {
  test("a row whose prompt text is over limits.max_prompt_chars is a 400 naming it, with nothing tokenized; at the limit is accepted", async () => {
    const { post } = await rawApp({ limits: { max_prompt_chars: 1000 } });
    const tok = await defaultTokenizer();
    const encode = tok.encode;
    let encoded = 0;
    tok.encode = (text: string) => {
      encoded += text.length;
      return encode.call(tok, text);
    };
    try {
      // 600 characters of content, 400 of reasoning, 1 more in the second message's content: 1001.
      const over = { rows: [{ prompt: [{ role: "user", content: "hello" }] }, { prompt: [{ role: "system", content: "s".repeat(600) }, { role: "user", content: "u" }, { role: "assistant", content: "", reasoning_content: "r".repeat(400) }] }], config: { rollout: { n: 8 } } };
      const r = await post(over);
      expect([r.status, await r.json()]).toEqual([
        400,
        { error: { code: "invalid_input", message: "rows[1].prompt: holds 1001 characters of text; a row's prompt may hold at most 1000 (limits.max_prompt_chars)", field: "rows[1].prompt" } },
      ]);
      expect(encoded).toBe(0);
      const at = await post({ rows: [{ prompt: [{ role: "user", content: [{ type: "text", text: "x".repeat(1000) }] }] }], config: { rollout: { n: 1 } } });
      expect(at.status).toBe(202);
    } finally {
      tok.encode = encode;
    }
  }, HANG_MS);

  test("the n sessions of a row with a long prompt tokenize it once (whole and left-truncated), with the same ids", async () => {
    const { rt, post } = await rawApp({ limits: { max_prompt_chars: 400_000 } });
    const tok = await defaultTokenizer();
    const encode = tok.encode;
    const long: number[] = [];
    tok.encode = (text: string) => {
      if (text.length >= 100_000) long.push(text.length);
      return encode.call(tok, text);
    };
    try {
      // 300,000 characters: whole under prompt_length 131072 (60,000 word tokens); with prompt_length 1024
      // it is over 2 × (1024 + 64) × 128 characters, so only a tail of 139,264 characters is encoded.
      for (const [promptLength, encodedChars, kept] of [[131_072, null, null], [1024, 139_264, 1024]] as const) {
        long.length = 0;
        const content = `${promptLength} ` + "word ".repeat(60_000);
        const r = await post({ rows: [{ prompt: [{ role: "user", content }] }], config: { rollout: { n: 8, prompt_length: promptLength } } });
        expect(r.status).toBe(202);
        const { batch_id, keys } = (await r.json()) as { batch_id: string; keys: string[] };
        await (await rt.service.lookup(batch_id)).run();
        expect(long.length).toBe(1);
        if (encodedChars !== null) expect(long[0]).toBe(encodedChars);
        const recs = await Promise.all(keys.map((k) => rt.store.get(k)));
        const first = recs[0]!.prompt_ids;
        if (kept !== null) expect(first.length).toBe(kept);
        for (const rec of recs) expect(rec!.prompt_ids).toEqual(first);
      }
    } finally {
      tok.encode = encode;
    }
  }, HANG_MS);
});
