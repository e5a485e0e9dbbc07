import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createSimEngineApp, type SimWireOptions } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { loadTokenizer } from "../../infra/node/model-dir.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `edgeloop doctor` (issue 25 item 4) as a user runs it: the real CLI process against simulated engines
// on loopback, healthy in each wire format and version and misconfigured one way at a time: with the
// simulator's own server switches (API keys, prompt-token details, scale-out) where it has them, and a
// small wrapper around its HTTP app that rewrites replies where it has none (ids or log-probs dropped,
// a route answering 404, no /metrics).
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-doctor-"));

type Next = (req: Request) => Promise<Response>;
type Wrap = (req: Request, next: Next) => Promise<Response>;
const servers: { stop(force?: boolean): unknown }[] = [];
let tokenizer: ChatTokenizer;

/** A simulated engine on a loopback port started with the server switches `wire`, its HTTP app behind `wrap` (default: as it is). */
function sim(wrap: Wrap = (req, next) => next(req), engine = new SimEngine({ tokenizer }), wire: SimWireOptions = {}): { url: string; engine: SimEngine } {
  const app = createSimEngineApp(engine, wire);
  const server = Bun.serve({ hostname: "127.0.0.1", port: 0, idleTimeout: 0, fetch: (req) => wrap(req, async (r) => app.fetch(r)) });
  servers.push(server);
  return { url: `http://127.0.0.1:${server.port}`, engine };
}

/** Rewrites the JSON reply of `path` with `edit` (2xx only). */
const editReply =
  (path: string, edit: (body: any) => void): Wrap =>
  async (req, next) => {
    const res = await next(req);
    if (new URL(req.url).pathname !== path || !res.ok) return res;
    const body = await res.json();
    edit(body);
    return Response.json(body, { status: res.status });
  };

/** Answers `status` with `body` on the given paths, else passes through. */
const answer =
  (paths: string[], status: number, body: unknown): Wrap =>
  async (req, next) =>
    paths.includes(new URL(req.url).pathname) ? Response.json(body, { status }) : next(req);

interface Run {
  code: number;
  out: string[];
  stderr: string;
  ms: number;
}

/** `edgeloop doctor ARGS` as a process; no engine key comes from the test's own environment. */
async function doctor(args: string[], env: Record<string, string> = {}): Promise<Run> {
  const base: Record<string, string | undefined> = { ...process.env, EDGELOOP_ENGINE_API_KEY: undefined, EDGELOOP_ENGINE_ADMIN_API_KEY: undefined, ...env };
  const started = performance.now();
  const p = Bun.spawn([process.execPath, MAIN, "doctor", ...args], { stdout: "pipe", stderr: "pipe", env: base as Record<string, string> });
  const [code, stdout, stderr] = await Promise.all([p.exited, new Response(p.stdout).text(), new Response(p.stderr).text()]);
  return { code, out: stdout.trimEnd().split("\n"), stderr, ms: performance.now() - started };
}

/** The line of `check`. */
const line = (r: Run, check: string) => r.out.find((l) => l.startsWith(check.padEnd(15))) ?? `(no ${check} line in:\n${r.out.join("\n")})`;

const LOGPROBS_VLLM = "log-probs      ok: 7, one per id, finite (vLLM: serve with --logprobs-mode processed_logprobs, which doctor cannot see)";
const STOP_OK = "stop ids       ok: sent qwen3's stop ids [151645, 151643]: the reply ended with 151645 (finish stop)";
const SKIPPED_TAIL = [
  "pause/resume   skipped: add --admin to pause and resume the engine once (only while no request is running)",
  "routed experts skipped: rollout.return_routed_experts is off",
  "teacher        skipped: rollout.teacher is not set",
];

let healthy: { url: string; engine: SimEngine };
const walls: number[] = [];

beforeAll(async () => {
  tokenizer = await defaultTokenizer();
  healthy = sim();
});

afterAll(() => {
  for (const s of servers) s.stop(true);
  rmSync(dir, { recursive: true, force: true });
  // The wall time of a healthy run (process start, tokenizer load and every probe), for the record.
  if (walls.length) console.log(`doctor wall time against the simulator: ${walls.map((m) => `${Math.round(m)} ms`).join(", ")}`);
});

describe("edgeloop doctor against a healthy simulated engine", () => {
  test("vllm (/v1/completions): every check ok, exit 0", async () => {
    const r = await doctor(["--engine", healthy.url]);
    walls.push(r.ms);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
    expect(r.out).toEqual([
      `edgeloop doctor: ${healthy.url} (engine.format vllm, model qwen3)`,
      "reachable      ok: GET /health 200",
      "auth           ok: no API key needed",
      "models         ok: edgeloop/sim-qwen3, max_model_len 40960",
      "generate       ok: POST /v1/completions answered 7 tokens (finish stop)",
      "token ids      ok: choices[0].token_ids",
      LOGPROBS_VLLM,
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize); the reply's ids decode to its text",
      STOP_OK,
      "cached tokens  ok: 32 of 38 prompt tokens cached on a repeated call",
      ...SKIPPED_TAIL,
      "edgeloop doctor: ready (9 ok, 3 skipped)",
    ]);
  }, HANG_MS);

  test("vllm-generate (/inference/v1/generate): every check ok (no text to decode: the probe text is compared)", async () => {
    const r = await doctor(["--engine", healthy.url, "--engine-format", "vllm-generate"]);
    walls.push(r.ms);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
    expect(r.out.slice(4, 10)).toEqual([
      "generate       ok: POST /inference/v1/generate answered 7 tokens (finish stop)",
      "token ids      ok: choices[0].token_ids",
      LOGPROBS_VLLM,
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize)",
      STOP_OK,
      "cached tokens  ok: 32 of 38 prompt tokens cached on a repeated call",
    ]);
    expect(r.out.at(-1)).toBe("edgeloop doctor: ready (9 ok, 3 skipped)");
  }, HANG_MS);

  test("sglang (/generate): every check ok", async () => {
    const r = await doctor(["--engine", healthy.url, "--engine-format", "sglang"]);
    walls.push(r.ms);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
    expect(r.out.slice(4, 10)).toEqual([
      "generate       ok: POST /generate answered 7 tokens (finish stop)",
      "token ids      ok: output_ids",
      "log-probs      ok: 7, one per id, finite",
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /v1/tokenize); the reply's ids decode to its text",
      STOP_OK,
      "cached tokens  ok: 32 of 38 prompt tokens cached on a repeated call",
    ]);
    expect(r.out.at(-1)).toBe("edgeloop doctor: ready (9 ok, 3 skipped)");
  }, HANG_MS);
});

describe("edgeloop doctor against a healthy simulated engine, other versions and modes", () => {
  test("vLLM 0.2x, both vLLM formats: every check ok", async () => {
    const s = sim(undefined, undefined, { engineVersion: "0.2x" });
    for (const format of ["vllm", "vllm-generate"]) {
      const r = await doctor(["--engine", s.url, "--engine-format", format]);
      expect({ format, code: r.code, stderr: r.stderr, last: r.out.at(-1) }).toEqual({ format, code: 0, stderr: "", last: "edgeloop doctor: ready (9 ok, 3 skipped)" });
      expect(line(r, "token ids")).toBe("token ids      ok: choices[0].token_ids");
    }
  }, HANG_MS);

  test("a server with --api-key and --admin-api-key, keys from the environment: every check ok, pause/resume too", async () => {
    const s = sim(undefined, undefined, { apiKey: "data-k3y", adminApiKey: "adm1n-k3y" });
    const env = { EDGELOOP_ENGINE_API_KEY: "data-k3y", EDGELOOP_ENGINE_ADMIN_API_KEY: "adm1n-k3y" };
    const r = await doctor(["--engine", s.url, "--engine-format", "sglang", "--admin", "--force"], env);
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
    expect(r.out[0]).toBe(`edgeloop doctor: ${s.url} (engine.format sglang, model qwen3, API key set, admin key set, --admin)`);
    expect(line(r, "auth")).toBe("auth           ok: API key accepted");
    expect(line(r, "pause/resume")).toBe('pause/resume   ok: POST /pause_generation {"mode":"abort"} and /continue_generation {} answered; a call was served after (SGLang has no is_paused to read back)');
    expect(r.out.at(-1)).toBe("edgeloop doctor: ready (10 ok, 2 skipped)");
    expect(r.out.join("\n")).not.toContain("k3y");
    expect(s.engine.pauses.map((p) => p.mode)).toEqual(["abort"]);
  }, HANG_MS);
});

describe("edgeloop doctor names the fix for a misconfigured engine", () => {
  test("a reply without token ids (no token_ids, plain token strings): token ids missing, exit 1", async () => {
    const s = sim(
      editReply("/v1/completions", (b) => {
        const c = b.choices[0];
        c.token_ids = null;
        c.logprobs.tokens = c.logprobs.tokens.map((_: string, i: number) => `tok${i}`);
      }),
    );
    const r = await doctor(["--engine", s.url]);
    expect(r.code).toBe(1);
    expect(r.out.slice(4, 10)).toEqual([
      "generate       ok: POST /v1/completions answered HTTP 200",
      "token ids      missing: the reply has neither choices[0].token_ids nor token_id:N strings in logprobs.tokens: edgeloop never re-encodes text; it needs vLLM >= 0.10.2 (return_token_ids) or a server that honours return_tokens_as_token_ids",
      "log-probs      skipped: no token ids to check (see token ids)",
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize)",
      "stop ids       skipped: no token ids to check (see token ids)",
      "cached tokens  skipped: no token ids to check (see token ids)",
    ]);
    expect(r.out.at(-1)).toBe("edgeloop doctor: 1 of 12 failed (token ids); 5 ok, 6 skipped");
  }, HANG_MS);

  test("ids only from token_id:N strings (vLLM < 0.10.2): ok, and the line says where they came from", async () => {
    const s = sim(editReply("/v1/completions", (b) => (b.choices[0].token_ids = null)));
    const r = await doctor(["--engine", s.url]);
    expect(r.code).toBe(0);
    expect(line(r, "token ids")).toBe("token ids      ok: token_id:N strings in choices[0].logprobs.tokens (no token_ids: vLLM < 0.10.2)");
  }, HANG_MS);

  test("a reply without log-probs: log-probs missing (vllm and sglang), exit 1", async () => {
    const v = sim(editReply("/v1/completions", (b) => (b.choices[0].logprobs = null)));
    const rv = await doctor(["--engine", v.url]);
    expect(rv.code).toBe(1);
    expect(line(rv, "token ids")).toBe("token ids      ok: choices[0].token_ids");
    expect(line(rv, "log-probs")).toBe(
      "log-probs      missing: the reply has no choices[0].logprobs.token_logprobs although logprobs: 0 was sent: rollout_log_probs need one per sampled token; a proxy in front may strip them",
    );
    expect(line(rv, "stop ids")).toBe(STOP_OK);
    expect(rv.out.at(-1)).toBe("edgeloop doctor: 1 of 12 failed (log-probs); 8 ok, 3 skipped");

    const s = sim(editReply("/generate", (b) => delete b.meta_info.output_token_logprobs));
    const rs = await doctor(["--engine", s.url, "--engine-format", "sglang"]);
    expect(rs.code).toBe(1);
    expect(line(rs, "log-probs")).toBe(
      "log-probs      missing: the reply has no meta_info.output_token_logprobs although return_logprob was sent: rollout_log_probs need one per sampled token; a proxy in front may strip meta_info",
    );
  }, HANG_MS);

  test("a log-prob count that differs from the ids: log-probs mismatch; ids that disagree with the token_id:N strings: token ids mismatch", async () => {
    const s = sim(editReply("/v1/completions", (b) => b.choices[0].logprobs.token_logprobs.pop()));
    const r = await doctor(["--engine", s.url]);
    expect(r.code).toBe(1);
    expect(line(r, "log-probs")).toBe("log-probs      mismatch: 6 log-probs for 7 token ids");
    expect(line(r, "cached tokens")).toBe("cached tokens  ok: 32 of 38 prompt tokens cached on a repeated call");
    const g = sim(editReply("/inference/v1/generate", (b) => b.choices[0].logprobs.content.pop()));
    const rg = await doctor(["--engine", g.url, "--engine-format", "vllm-generate"]);
    expect(rg.code).toBe(1);
    expect(line(rg, "token ids")).toBe("token ids      mismatch: choices[0].token_ids disagree with the ids in logprobs.content");
  }, HANG_MS);

  test("the wrong --model (llama3_1 against a Qwen3 engine): tokenizer and stop ids mismatch", async () => {
    const llama = await loadTokenizer("llama3_1");
    const probe = (await import("../../shared/rollout/teacher-scoring.ts")).TOKENIZER_PROBE;
    const [q, l] = [tokenizer.encode(probe), llama.encode(probe)];
    let at = 0;
    while (q[at] === l[at]) at++;
    const r = await doctor(["--engine", healthy.url, "--model", "llama3_1"]);
    expect(r.code).toBe(1);
    expect(r.out[0]).toBe(`edgeloop doctor: ${healthy.url} (engine.format vllm, model llama3_1)`);
    expect(line(r, "tokenizer")).toBe(
      `tokenizer      mismatch: the engine's tokenizer differs from --model llama3_1's: its ids of a probe text differ at position ${at} (engine ${JSON.stringify(q.slice(at, at + 3))}…, llama3_1 ${JSON.stringify(l.slice(at, at + 3))}…); start edgeloop with the served model's --model (a built-in name or the model's directory)`,
    );
    expect(line(r, "stop ids")).toBe(
      "stop ids       mismatch: sent llama3_1's stop ids [128009, 128001, 128008]: the engine finished (stop) at id 151645, which is not a stop id of llama3_1: the served model's end-of-turn ids differ from --model's (another model, or its generation_config.json eos_token_id)",
    );
    expect(r.out.at(-1)).toBe("edgeloop doctor: 2 of 12 failed (tokenizer, stop ids); 7 ok, 3 skipped");
  }, HANG_MS);

  test("the wrong --model without a tokenize endpoint: the reply's ids do not decode to its text", async () => {
    const s = sim(answer(["/tokenize"], 404, { detail: "Not Found" }));
    const r = await doctor(["--engine", s.url, "--model", "llama3_1"]);
    expect(r.code).toBe(1);
    expect(line(r, "tokenizer")).toStartWith("tokenizer      mismatch: the reply's ids decode with --model llama3_1 to ");
    expect(line(r, "tokenizer")).toEndWith(`the engine's text is "I cannot help with that.<|im_end|>": start edgeloop with the served model's --model`);
  }, HANG_MS);

  test("an API key the server wants: auth missing with the variable to set; the right key passes and is never printed; a wrong one is a mismatch", async () => {
    const s = sim(undefined, undefined, { apiKey: "s3cret-key" });
    const none = await doctor(["--engine", s.url]);
    expect(none.code).toBe(1);
    expect(none.out.slice(1, 5)).toEqual([
      "reachable      ok: GET /health 200",
      "auth           missing: the server wants an API key (GET /v1/models 401, POST /v1/completions 401): set EDGELOOP_ENGINE_API_KEY (or --engine-api-key, engine.api_key) to its --api-key",
      "models         warn: GET /v1/models is HTTP 401 (see auth): the server's max_model_len cannot be read; the budget falls back to prompt_length + response_length = 1024",
      "generate       skipped: the server refused the call (see auth)",
    ]);
    // vLLM's /tokenize is not guarded: the probe text is still compared.
    expect(line(none, "tokenizer")).toBe("tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize)");
    expect(none.out.at(-1)).toBe("edgeloop doctor: 1 of 12 failed (auth); 2 ok, 1 warn, 8 skipped");

    const good = await doctor(["--engine", s.url], { EDGELOOP_ENGINE_API_KEY: "s3cret-key" });
    expect(good.code).toBe(0);
    expect(good.out[0]).toBe(`edgeloop doctor: ${s.url} (engine.format vllm, model qwen3, API key set)`);
    expect(line(good, "auth")).toBe("auth           ok: API key accepted");
    expect(good.out.join("\n") + good.stderr).not.toContain("s3cret");

    const wrong = await doctor(["--engine", s.url, "--engine-api-key", "not-it"]);
    expect(wrong.code).toBe(1);
    expect(line(wrong, "auth")).toBe("auth           mismatch: the server refused engine.api_key (GET /v1/models 401, POST /v1/completions 401): set it to the server's --api-key");
    expect(wrong.out.join("\n") + wrong.stderr).not.toContain("not-it");
  }, HANG_MS);

  test("vllm-generate on a server without the endpoint (404; main and 0.2x): generate missing, naming both switches", async () => {
    const old = await doctor(["--engine", sim(undefined, undefined, { scaleOut: false, engineVersion: "0.2x" }).url, "--engine-format", "vllm-generate"]);
    expect(line(old, "generate")).toBe(
      "generate       missing: POST /inference/v1/generate is HTTP 404: start vLLM with --enable-scale-out (main) or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (0.2x), or use --engine-format vllm",
    );
    const s = sim(undefined, undefined, { scaleOut: false });
    const r = await doctor(["--engine", s.url, "--engine-format", "vllm-generate"]);
    expect(r.code).toBe(1);
    expect(r.out.slice(4, 10)).toEqual([
      "generate       missing: POST /inference/v1/generate is HTTP 404: start vLLM with --enable-scale-out (main) or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (0.2x), or use --engine-format vllm",
      "token ids      skipped: no reply to check (see generate)",
      "log-probs      skipped: no reply to check (see generate)",
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize)",
      "stop ids       skipped: no reply to check (see generate)",
      "cached tokens  skipped: no reply to check (see generate)",
    ]);
  }, HANG_MS);

  test("vLLM without --enable-prompt-tokens-details: cached tokens missing, naming the flag", async () => {
    const s = sim(undefined, undefined, { promptTokensDetails: false });
    const r = await doctor(["--engine", s.url]);
    expect(r.code).toBe(1);
    expect(line(r, "cached tokens")).toBe(
      "cached tokens  missing: the replies carry no usage.prompt_tokens_details.cached_tokens: start vLLM with --enable-prompt-tokens-details (without it prefix-cache hits go unreported)",
    );
    expect(r.out.at(-1)).toBe("edgeloop doctor: 1 of 12 failed (cached tokens); 8 ok, 3 skipped");
  }, HANG_MS);

  test("no max_model_len from /v1/models: a warning naming the fallback budget (exit 0); rollout.max_model_len above the server's: mismatch", async () => {
    const s = sim(answer(["/v1/models"], 404, { detail: "Not Found" }));
    const r = await doctor(["--engine", s.url]);
    expect(r.code).toBe(0);
    expect(line(r, "models")).toBe(
      "models         warn: GET /v1/models gives no max_model_len (HTTP 404): the budget falls back to prompt_length + response_length = 1024; set rollout.max_model_len (--max-model-len) to the server's context",
    );
    expect(r.out.at(-1)).toBe("edgeloop doctor: ready (8 ok, 1 warn, 3 skipped)");
    const over = await doctor(["--engine", healthy.url, "--max-model-len", "65536"]);
    expect(over.code).toBe(1);
    expect(line(over, "models")).toBe(
      "models         mismatch: rollout.max_model_len 65536 exceeds the server's max_model_len 40960: long trajectories would overflow; lower it, or leave it unset to use the server's",
    );
  }, HANG_MS);

  test("nothing listening: reachable missing, every other check skipped, exit 1", async () => {
    const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
    const url = `http://127.0.0.1:${s.port}`;
    s.stop(true);
    const r = await doctor(["--engine", url]);
    expect(r.code).toBe(1);
    expect(line(r, "reachable")).toStartWith(`reachable      missing: nothing answers at ${url} (GET /health: `);
    expect(line(r, "reachable")).toEndWith("): start the server, or fix --engine");
    expect(line(r, "models")).toBe(`models         skipped: ${url} is not reachable (see reachable)`);
    expect(r.out.at(-1)).toBe("edgeloop doctor: 1 of 12 failed (reachable); 0 ok, 11 skipped");
  }, HANG_MS);
});

describe("edgeloop doctor --admin", () => {
  test("a paused engine: pause/resume mismatch, generation checks skipped (nothing waits on the held request), exit 1", async () => {
    const s = sim();
    await s.engine.pause("keep");
    const r = await doctor(["--engine", s.url, "--admin"]);
    expect(r.code).toBe(1);
    expect(r.out.slice(4, 11)).toEqual([
      "generate       skipped: the engine is paused (see pause/resume)",
      "token ids      skipped: the engine is paused (see pause/resume)",
      "log-probs      skipped: the engine is paused (see pause/resume)",
      "tokenizer      ok: a probe text tokenizes to qwen3's ids (POST /tokenize)",
      "stop ids       skipped: the engine is paused (see pause/resume)",
      "cached tokens  skipped: the engine is paused (see pause/resume)",
      `pause/resume   mismatch: the engine is paused (GET /is_paused true at ${s.url}): it holds every request until POST /resume; resume it (or let the trainer finish its weight update) and run doctor again`,
    ]);
    // Doctor never resumes a pause it did not make.
    expect(s.engine.paused).toBe(true);
    expect(s.engine.pauses.length).toBe(1);
    expect(s.engine.stats.requests).toBe(0);
  }, HANG_MS);

  test("an idle vLLM with request gauges on /metrics: one abort pause and resume, /is_paused read back, exit 0", async () => {
    // The simulator serves vLLM's (and SGLang's) request gauges on /metrics.
    const s = sim();
    const r = await doctor(["--engine", s.url, "--admin"]);
    expect(r.code).toBe(0);
    expect(line(r, "pause/resume")).toBe("pause/resume   ok: POST /pause?mode=abort and /resume answered; GET /is_paused said true, then false; a call was served after");
    expect(s.engine.pauses.map((p) => ({ mode: p.mode, clear_cache: p.clear_cache, resumed: p.resumed_ms !== null }))).toEqual([{ mode: "abort", clear_cache: false, resumed: true }]);
    expect(s.engine.paused).toBe(false);
  }, HANG_MS);

  test("a busy vLLM (a request generating): pause/resume skipped, the engine never paused", async () => {
    const s = sim(undefined, new SimEngine({ tokenizer, latency: { decode_ms_per_token: 60_000 } }));
    const engine = s.engine;
    const held = fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2 }) }).catch(() => undefined);
    while (engine.generating === 0) await Bun.sleep(5);
    const r = await doctor(["--engine", s.url, "--admin", "--timeout", "1"]);
    expect(line(r, "pause/resume")).toBe(`pause/resume   skipped: requests are running or waiting (1 at ${s.url}): a pause would abort them; run doctor --admin while the engine is idle`);
    expect(engine.pauses.length).toBe(0);
    void held;
  }, HANG_MS);

  test("a paused SGLang (which cannot say so) is never resumed by doctor --admin", async () => {
    const s = sim();
    await s.engine.pause("in_place");
    const r = await doctor(["--engine", s.url, "--engine-format", "sglang", "--admin", "--force", "--timeout", "1"]);
    expect(r.code).toBe(1);
    expect(line(r, "pause/resume")).toBe(
      "pause/resume   skipped: the generate call was not served (see generate): SGLang cannot say whether it is paused, so doctor does not pause or resume it (a resume would end a trainer's pause)",
    );
    expect(s.engine.paused).toBe(true);
    expect(s.engine.pauses.length).toBe(1);
    s.engine.resume();
  }, HANG_MS);

  test("no request counts to read: skipped unless --force", async () => {
    // A server without metrics (SGLang without --enable-metrics and no /get_load answer).
    const s = sim(answer(["/metrics", "/get_load"], 404, { detail: "Not Found" }));
    const r = await doctor(["--engine", s.url, "--admin"]);
    expect(r.code).toBe(0);
    expect(line(r, "pause/resume")).toBe(
      `pause/resume   skipped: cannot tell whether requests are running (${s.url}: GET /metrics is HTTP 404): add --force to pause and resume anyway (requests running there would end as aborts)`,
    );
    expect(s.engine.pauses.length).toBe(0);
    const forced = await doctor(["--engine", s.url, "--engine-format", "sglang", "--admin", "--force"]);
    expect(forced.code).toBe(0);
    expect(line(forced, "pause/resume")).toBe(
      'pause/resume   ok: POST /pause_generation {"mode":"abort"} and /continue_generation {} answered; a call was served after (SGLang has no is_paused to read back)',
    );
    expect(s.engine.pauses.map((p) => p.mode)).toEqual(["abort"]);
  }, HANG_MS);

  test("vLLM without VLLM_SERVER_DEV_MODE (the dev routes are 404): pause/resume missing, naming the variable", async () => {
    const s = sim(answer(["/pause", "/resume", "/is_paused"], 404, { detail: "Not Found" }));
    const r = await doctor(["--engine", s.url, "--admin"]);
    expect(r.code).toBe(1);
    expect(line(r, "pause/resume")).toBe("pause/resume   missing: /is_paused is HTTP 404: start vLLM with VLLM_SERVER_DEV_MODE=1 (it mounts /pause, /resume and /is_paused)");
  }, HANG_MS);

  test("through edgeloop's own gateway: the control 404 is the gateway's, so the line names engine.admin_urls (not VLLM_SERVER_DEV_MODE)", async () => {
    const replica = sim();
    const gw = createGatewayApp({ replicas: [replica.url], healthIntervalMs: 0 });
    const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: gw.fetch });
    servers.push(server);
    const url = `http://127.0.0.1:${server.port}`;
    const r = await doctor(["--engine", url, "--admin", "--force"]);
    expect(r.code).toBe(1);
    expect(line(r, "pause/resume")).toBe(
      `pause/resume   missing: /is_paused is HTTP 404 from edgeloop's gateway at ${url}, which forwards no engine control: set engine.admin_urls to the replicas' own URLs (doctor and POST /v1/engine/pause reach each one there)`,
    );
    expect(line(r, "generate")).toStartWith("generate       ok: ");
    expect(replica.engine.pauses).toEqual([]);
  }, HANG_MS);

  test("a generate call that fails (404) does not fail pause/resume: the pause and resume are checked, no call is tried after", async () => {
    const s = sim(answer(["/v1/completions"], 404, { detail: "Not Found" }));
    const r = await doctor(["--engine", s.url, "--admin", "--force"]);
    expect(line(r, "generate")).toStartWith("generate       missing: POST /v1/completions is HTTP 404");
    expect(line(r, "pause/resume")).toBe(
      "pause/resume   warn: POST /pause?mode=abort and /resume answered; GET /is_paused said true, then false; no call was tried after (the generate call fails, see generate)",
    );
    expect(s.engine.pauses.map((p) => p.mode)).toEqual(["abort"]);
  }, HANG_MS);

  test("vLLM control routes refused (401) by something in front: a set key is named as refused, no key asks for the admin key; no SGLang advice", async () => {
    const s = sim(answer(["/pause", "/resume", "/is_paused"], 401, { error: "Unauthorized" }));
    const withKey = await doctor(["--engine", s.url, "--admin", "--force", "--engine-api-key", "data-key"]);
    expect(line(withKey, "auth")).toBe("auth           ok: API key accepted");
    expect(line(withKey, "pause/resume")).toBe(
      "pause/resume   mismatch: /is_paused is HTTP 401: the key sent there (engine.api_key) was refused; vLLM's --api-key does not guard its control routes, so a proxy in front wants another key: set engine.admin_api_key to it, or engine.admin_urls to the engines' own URLs",
    );
    const none = await doctor(["--engine", s.url, "--admin", "--force"]);
    expect(line(none, "pause/resume")).toBe(
      "pause/resume   missing: /is_paused is HTTP 401: a key is wanted there (vLLM's --api-key does not guard its control routes: a proxy in front?): set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)",
    );
    for (const r of [withKey, none]) expect(r.out.join("\n")).not.toContain("SGLang");
  }, HANG_MS);

  test("SGLang with --admin-api-key: pause/resume missing the admin key without it, ok with it", async () => {
    const s = sim(undefined, undefined, { adminApiKey: "adm1n" });
    const args = ["--engine", s.url, "--engine-format", "sglang", "--admin", "--force"];
    const r = await doctor(args);
    expect(r.code).toBe(1);
    expect(line(r, "pause/resume")).toBe(
      "pause/resume   missing: /pause_generation is HTTP 401: the control routes want SGLang's --admin-api-key: set EDGELOOP_ENGINE_ADMIN_API_KEY (or --engine-admin-api-key, engine.admin_api_key)",
    );
    expect(s.engine.paused).toBe(false);
    const ok = await doctor(args, { EDGELOOP_ENGINE_ADMIN_API_KEY: "adm1n" });
    expect(ok.code).toBe(0);
    expect(ok.out[0]).toBe(`edgeloop doctor: ${s.url} (engine.format sglang, model qwen3, admin key set, --admin)`);
    expect(line(ok, "pause/resume")).toStartWith("pause/resume   ok: ");
  }, HANG_MS);
});

describe("edgeloop doctor with routed experts and a teacher configured", () => {
  const config = (name: string, yaml: string) => {
    const p = join(dir, name);
    writeFileSync(p, yaml);
    return p;
  };

  test("SGLang routed experts: decoded with engine.moe; the wrong shape is a mismatch; a server without the flag is missing", async () => {
    const ok = await doctor(["--engine", healthy.url, "--config", config("moe.yaml", "rollout: {return_routed_experts: true}\nengine: {format: sglang, moe: {layers: 4, top_k: 2}}\n")]);
    expect(ok.code).toBe(0);
    expect(line(ok, "routed experts")).toBe("routed experts ok: meta_info.routed_experts decodes as 44 tokens × 4 layers × top-2 (engine.moe)");

    const wrong = await doctor(["--engine", healthy.url, "--config", config("moe3.yaml", "rollout: {return_routed_experts: true}\nengine: {format: sglang, moe: {layers: 3, top_k: 2}}\n")]);
    expect(wrong.code).toBe(1);
    expect(line(wrong, "routed experts")).toBe(
      "routed experts mismatch: meta_info.routed_experts holds 352 int32 values, expected (38 + 7 − 1) tokens × 3 layers × 2 top_k = 264 (check engine.moe)",
    );

    const s = sim(editReply("/generate", (b) => delete b.meta_info.routed_experts));
    const off = await doctor(["--engine", s.url, "--config", join(dir, "moe.yaml")]);
    expect(off.code).toBe(1);
    expect(line(off, "routed experts")).toBe("routed experts missing: the reply has no meta_info.routed_experts: start SGLang with --enable-return-routed-experts");
  }, HANG_MS);

  test("return_routed_experts with a vLLM format is a config error (exit 2), as for rollout", async () => {
    const r = await doctor(["--engine", healthy.url, "--config", config("moe-vllm.yaml", "rollout: {return_routed_experts: true}\n")]);
    expect(r.code).toBe(2);
    expect(r.stderr).toStartWith("edgeloop: config rollout.return_routed_experts: is not supported with engine.format vllm or vllm-generate");
  }, HANG_MS);

  test("a teacher: same tokenizer and one scoring call (ok); a teacher with another tokenizer: mismatch", async () => {
    const ok = await doctor(["--engine", healthy.url, "--config", config("teacher.yaml", `rollout: {teacher: {url: "${healthy.url}"}}\n`)]);
    expect(ok.code).toBe(0);
    expect(line(ok, "teacher")).toBe(`teacher        ok: vllm at ${healthy.url}: same tokenizer; scored 7 response tokens (prompt log-probs)`);

    const llama = sim(undefined, new SimEngine({ tokenizer: await loadTokenizer("llama3_1") }));
    const other = await doctor(["--engine", healthy.url, "--config", config("teacher2.yaml", `rollout: {teacher: {url: "${llama.url}", format: sglang}}\n`)]);
    expect(other.code).toBe(1);
    expect(line(other, "teacher")).toStartWith(`teacher        mismatch: the teacher (sglang at ${llama.url}) uses another tokenizer than the policy: its ids of a probe text differ at position `);
  }, HANG_MS);
});

describe("edgeloop doctor flag and config errors (exit 2)", () => {
  test("no engine URL, --engine sim, --force without --admin", async () => {
    const none = await doctor([]);
    expect({ code: none.code, stderr: none.stderr.trim() }).toEqual({
      code: 2,
      stderr:
        "edgeloop: config engine.url: doctor probes a running engine: pass its URL (e.g. http://127.0.0.1:8000); to try doctor on the simulator, start one with `edgeloop sim-engine --port 8000` (set --engine or engine.url)",
    });
    const simUrl = await doctor(["--engine", "sim"]);
    expect(simUrl.code).toBe(2);
    expect(simUrl.stderr.trim()).toStartWith("edgeloop: --engine: doctor probes a running engine: pass its URL");
    const force = await doctor(["--engine", healthy.url, "--force"]);
    expect({ code: force.code, stderr: force.stderr.trim() }).toEqual({
      code: 2,
      stderr: "edgeloop: --force: applies with --admin only (it lets the pause/resume check run when doctor cannot tell whether requests are running)",
    });
  }, HANG_MS);
});

describe("the README's doctor samples", () => {
  // Each sample is a command and what it printed; replayed against a simulator started the way the prose says.
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const at = readme.indexOf("### Checking an engine first: `edgeloop doctor`");
  const samples = [...readme.slice(at).matchAll(/```\n\$ npx edgeloop doctor ([^\n]*)\n([\s\S]*?)```/g)].slice(0, 2).map((m) => ({ args: m[1]!.split(" "), out: m[2]!.trimEnd().split("\n") }));

  test("a healthy vLLM, and a Qwen3 vLLM without prompt-token details and dev mode probed with --model llama3_1, print what the README shows", async () => {
    expect(samples.length).toBe(2);
    const engines = [healthy, sim(answer(["/pause", "/resume", "/is_paused"], 404, { detail: "Not Found" }), undefined, { promptTokensDetails: false })];
    for (const [i, sample] of samples.entries()) {
      const url = engines[i]!.url;
      const r = await doctor(sample.args.map((a) => (a === "http://127.0.0.1:8000" ? url : a)));
      expect(r.out).toEqual(sample.out.map((l) => l.replaceAll("http://127.0.0.1:8000", url)));
      expect(r.code).toBe(i === 0 ? 0 : 1);
    }
  }, HANG_MS);
});
