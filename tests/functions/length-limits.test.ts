import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";

// Issue 26 / audit S18: a batch's rollout.prompt_length and rollout.response_length are bounded by the
// server's limits.max_prompt_length / limits.max_response_length (default 131072 each): more is a 400 naming the field.

const runtimes: Runtime[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
});

async function app() {
  const rt = await buildRuntime({ n: 1, seed: 7 });
  runtimes.push(rt);
  const a = createRolloutsApp({ service: rt.service });
  return (rollout: unknown) =>
    a.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [{ prompt: [{ role: "user", content: "hello" }] }], config: { rollout } }) });
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
