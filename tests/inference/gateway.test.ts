import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { createGatewayApp, REPLICA_HEADER, type Gateway, type GatewayOptions } from "../../functions/gateway.ts";
import { ConfigError, EngineUnavailableError } from "../../shared/errors.ts";
import { SglangClient, VllmClient, type GenerateRequest } from "../../shared/inference/index.ts";
import { SamplingParams, type TokenOutput } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine, SimEngineClient } from "../../infra/sim-engine/index.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { waitFor } from "../helpers/wait.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const SCRIPT = {
  seed: 3,
  rules: [{ when: "weather", turns: ["<tool_call>\n{\"name\": \"weather\", \"arguments\": {}}\n</tool_call>", "It is sunny.", "Anything else?"] }],
  default: ["Done."],
};

let tok: ChatTokenizer;
let sim: RunningSimEngine;
const servers: { stop(force?: boolean): unknown }[] = [];

beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ replicas: 2, script: SCRIPT, tokenizer: tok });
});
afterEach(async () => {
  for (const r of sim.replicas) {
    r.revive();
    r.engine.setFault(null);
  }
  await Promise.all(servers.splice(0).map((s) => s.stop(true)));
});
afterAll(() => sim.stop());

const ADMIN = { authorization: "Bearer test-admin-token" };

function serveGateway(opts: Partial<GatewayOptions> = {}): { gw: Gateway; url: string } {
  const gw = createGatewayApp({ replicas: sim.urls, healthIntervalMs: 0, adminToken: "test-admin-token", ...opts });
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
  servers.push(server);
  return { gw, url: `http://127.0.0.1:${server.port}` };
}

const sp = SamplingParams.parse({ stop_token_ids: [151645] });

/** Runs `turns` turns of one trajectory, appending a tool response after each, calling `between` before turn i. */
async function trajectory(
  generate: (r: GenerateRequest) => Promise<TokenOutput>,
  key: string,
  turns: number,
  between?: (turn: number) => Promise<void> | void,
): Promise<{ outputs: TokenOutput[]; requestIds: string[] }> {
  let prompt = tok.encode(`<|im_start|>user\n[${key.replace(/^ref-/, "")}] What is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n`);
  const outputs: TokenOutput[] = [];
  const requestIds: string[] = [];
  for (let t = 0; t < turns; t++) {
    await between?.(t);
    const request_id = crypto.randomUUID();
    requestIds.push(request_id);
    const out = await generate({ request_id, routing_key: key, prompt_ids: prompt, sampling_params: sp, max_tokens: 256 });
    outputs.push(out);
    prompt = [...prompt, ...out.token_ids, ...tok.encode("\n<|im_start|>user\n<tool_response>\n{\"sky\": \"clear\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")];
  }
  return { outputs, requestIds };
}

/** The request-log lines for `key` on each replica. */
function logsFor(key: string) {
  return sim.replicas.map((r) => r.engine.requests.filter((l) => l.routing_key === key));
}

describe("gateway routing", () => {
  test("a three-turn trajectory with two replicas: three distinct request ids, one routing key, one replica", async () => {
    const { url } = serveGateway({ policy: "least_inflight_sticky" });
    const client = new VllmClient({ url });
    const { outputs, requestIds } = await trajectory((r) => client.generate(r), "traj-three", 3);
    expect(tok.decode(outputs[0].token_ids)).toBe('<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call><|im_end|>');
    expect(outputs[1].token_ids).toEqual([...tok.encode("It is sunny."), 151645]);
    expect(outputs.map((o) => o.stop_reason)).toEqual([151645, 151645, 151645]);
    const logs = logsFor("traj-three");
    const served = logs.filter((l) => l.length > 0);
    expect(served.length).toBe(1);
    expect(served[0].map((l) => l.request_id)).toEqual(requestIds);
    expect(new Set(requestIds).size).toBe(3);
    expect(new Set(served[0].map((l) => l.routing_key))).toEqual(new Set(["traj-three"]));
    // The client reports the serving replica (the gateway's x-edgeloop-replica) with every output.
    const servedBy = sim.urls[logs.findIndex((l) => l.length > 0)];
    expect(outputs.map((o) => o.extra_fields.replica)).toEqual([servedBy, servedBy, servedBy]);
    // Stickiness shows in the prefix cache: later turns reuse the earlier turns' blocks.
    expect(outputs[0].cached_tokens).toBe(0);
    expect(outputs[2].cached_tokens).toBeGreaterThan(outputs[1].cached_tokens!);
    expect(outputs[1].cached_tokens).toBeGreaterThan(0);
  });

  test("the response names the replica; the SGLang path and X-SMG-Routing-Key work too", async () => {
    const { url } = serveGateway({ policy: "bounded_load_hash" });
    const body = JSON.stringify({ input_ids: tok.encode("hello"), sampling_params: { max_new_tokens: 2 }, return_logprob: true, rid: "x1" });
    const first = await fetch(`${url}/generate`, { method: "POST", body, headers: { "x-smg-routing-key": "smg-key" } });
    expect(first.status).toBe(200);
    const replica = first.headers.get(REPLICA_HEADER)!;
    expect(sim.urls).toContain(replica);
    expect((await first.json()).output_ids).toEqual(tok.encode("Done."));
    for (let i = 0; i < 3; i++) {
      const again = await fetch(`${url}/generate`, { method: "POST", body, headers: { "x-smg-routing-key": "smg-key" } });
      expect(again.headers.get(REPLICA_HEADER)).toBe(replica);
      await again.arrayBuffer();
    }
    const sg = await new SglangClient({ url }).generate({ request_id: "s1", routing_key: "sg", prompt_ids: tok.encode("hi"), sampling_params: sp, max_tokens: 8 });
    expect(sg.token_ids).toEqual([...tok.encode("Done."), 151645]);
    const models = await fetch(`${url}/v1/models`);
    expect((await models.json()).data[0].max_model_len).toBe(40960);
  });

  for (const policy of ["least_inflight_sticky", "bounded_load_hash"] as const) {
    test(`${policy}: failover when the trajectory's replica dies mid-trajectory, then it stays on the survivor`, async () => {
      // The same trajectory on a fresh in-process engine (its own cache) is the reference.
      const ref = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
      const reference = await trajectory((r) => ref.generate(r), `ref-${policy}`, 4);
      const { gw, url } = serveGateway({ policy });
      const client = new VllmClient({ url });
      const key = policy;
      let first = "";
      const { outputs } = await trajectory((r) => client.generate(r), key, 4, async (t) => {
        if (t === 1) {
          first = sim.replicas.find((r) => logsFor(key)[sim.replicas.indexOf(r)].length > 0)!.url;
          await sim.replicas.find((r) => r.url === first)!.kill();
        }
        if (t === 3) sim.replicas.find((r) => r.url === first)!.revive();
      });
      expect(outputs.map((o) => o.token_ids)).toEqual(reference.outputs.map((o) => o.token_ids));
      expect(outputs.map((o) => o.log_probs)).toEqual(reference.outputs.map((o) => o.log_probs));
      const logs = logsFor(key);
      const firstIdx = sim.urls.indexOf(first);
      expect(logs[firstIdx].length).toBe(1);
      expect(logs[1 - firstIdx].length).toBe(3);
      // The survivor starts cold, then its cache warms up.
      expect(outputs[1].cached_tokens).toBe(0);
      expect(outputs[3].cached_tokens).toBeGreaterThan(0);
      expect(gw.replicas().find((r) => r.url === first)).toMatchObject({ healthy: false, failures: 1 });
      await gw.checkHealth();
      expect(gw.replicas().every((r) => r.healthy)).toBe(true);
    });
  }

  test("a 5xx before any token is retried on the other replica", async () => {
    const { url } = serveGateway({ policy: "least_inflight_sticky" });
    const body = JSON.stringify({ prompt: tok.encode("hello"), max_tokens: 2 });
    const headers = { "x-session-id": "retry-key" };
    const a = await fetch(`${url}/v1/completions`, { method: "POST", body, headers });
    const pinned = a.headers.get(REPLICA_HEADER)!;
    await a.arrayBuffer();
    sim.replicas.find((r) => r.url === pinned)!.engine.setFault({ kind: "http_500", times: 1 });
    const b = await fetch(`${url}/v1/completions`, { method: "POST", body, headers });
    expect(b.status).toBe(200);
    expect(b.headers.get(REPLICA_HEADER)).toBe(sim.urls.find((u) => u !== pinned)!);
    expect((await b.json()).choices[0].finish_reason).toBe("length");
  });

  test("a replica that hangs past the attempt deadline is abandoned for another; the hung request ends on the replica", async () => {
    const { url } = serveGateway({ policy: "least_inflight_sticky", attemptTimeoutMs: 300 });
    const body = JSON.stringify({ prompt: tok.encode("hang test"), max_tokens: 2 });
    const headers = { "x-session-id": "hang-key" };
    const a = await fetch(`${url}/v1/completions`, { method: "POST", body, headers });
    const pinned = a.headers.get(REPLICA_HEADER)!;
    await a.arrayBuffer();
    const stuck = sim.replicas.find((r) => r.url === pinned)!;
    stuck.engine.setFault({ kind: "hang", times: 1 });
    const b = await fetch(`${url}/v1/completions`, { method: "POST", body, headers });
    expect([b.status, b.headers.get(REPLICA_HEADER)]).toEqual([200, sim.urls.find((u) => u !== pinned)!]);
    await b.arrayBuffer();
    // The abandoned call is cancelled on the replica (client_gone), not left running.
    await waitFor(() => stuck.engine.stats.inflight === 0, "the abandoned call cancelled on the replica", HANG_MS);
    expect(stuck.engine.stats.inflight).toBe(0);
    expect(stuck.engine.requests.at(-1)!.fault).toBe("client_gone");
  });

  test("no replica left: 503 no_available_workers, which the client reads as EngineUnavailableError", async () => {
    const { url } = serveGateway();
    await Promise.all(sim.replicas.map((r) => r.kill()));
    const res = await fetch(`${url}/v1/completions`, { method: "POST", body: "{}" });
    expect(res.status).toBe(503);
    expect((await res.json()).error.code).toBe("no_available_workers");
    const e = await new VllmClient({ url }).generate({ request_id: "x", routing_key: "k", prompt_ids: [1], sampling_params: sp, max_tokens: 1 }).catch((x) => x);
    expect(e).toBeInstanceOf(EngineUnavailableError);
    for (const r of sim.replicas) r.engine.setFault({ kind: "http_503" });
    for (const r of sim.replicas) r.revive();
    const both5xx = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: [1], max_tokens: 1 }) });
    expect(both5xx.status).toBe(503);
    expect((await both5xx.json()).error.type).toBe("ServiceUnavailableError");
  });

  test("replicas can be added and removed at run time; health follows the replicas", async () => {
    const { gw, url } = serveGateway({ replicas: [sim.urls[0]] });
    expect((await (await fetch(`${url}/admin/replicas`, { headers: ADMIN })).json()).replicas.map((r: { url: string }) => r.url)).toEqual([sim.urls[0]]);
    const add = await fetch(`${url}/admin/replicas`, { method: "POST", headers: { ...ADMIN, "content-type": "application/json" }, body: JSON.stringify({ url: sim.urls[1] }) });
    expect(add.status).toBe(201);
    expect(gw.replicas().map((r) => r.url)).toEqual(sim.urls);
    const del = await fetch(`${url}/admin/replicas`, { method: "DELETE", headers: { ...ADMIN, "content-type": "application/json" }, body: JSON.stringify({ url: sim.urls[0] }) });
    expect(del.status).toBe(200);
    const res = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: [1, 2], max_tokens: 1 }), headers: { "x-session-id": "k" } });
    expect(res.headers.get(REPLICA_HEADER)).toBe(sim.urls[1]);
    await res.arrayBuffer();
    const bad = await fetch(`${url}/admin/replicas`, { method: "POST", headers: { ...ADMIN, "content-type": "application/json" }, body: JSON.stringify({ url: "ftp://x" }) });
    expect([bad.status, (await bad.json()).error.field]).toEqual([400, "url"]);
    expect((await fetch(`${url}/health`)).status).toBe(200);
    await sim.replicas[1].kill();
    await gw.checkHealth();
    const h = await fetch(`${url}/health`);
    expect([h.status, await h.json()]).toEqual([503, { status: "unavailable", healthy: 0, replicas: 1 }]);
  });

  test("options are validated eagerly", () => {
    expect(() => createGatewayApp({ replicas: ["not a url"] })).toThrow(ConfigError);
    expect(() => createGatewayApp({ replicas: [], policy: "random" as never })).toThrow("config gateway.policy");
  });
});
