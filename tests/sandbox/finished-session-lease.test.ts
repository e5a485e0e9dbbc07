import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { createSessionExecutor, sessionLoopFactory, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { SandboxSpec, type ChatMessage } from "../../shared/schema/index.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { SessionHost } from "../../shared/session/session-host.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { MemoryLeaseStore } from "../../shared/tools/lease-store.ts";
import { SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import { call, FakeTools, ScriptedClient } from "../agent-loop/helpers.ts";
import { delegatingQueue } from "../helpers/delegating-queue.ts";

// A durable session with a sandbox made at start (`create: start`) that finished and released its sandbox, whose
// owner then died before its record was written (here: the write fails). The job's next run reads the finished
// session back: it must not ask for the released sandbox again (that failed the trajectory as sandbox_lost in the
// lease chaos run), and its record still names the sandbox it ran in.
let tok: ChatTokenizer;
let provider: SandboxProvider;
beforeAll(async () => {
  tok = await defaultTokenizer();
  provider = startSandboxProvider({ port: 0 });
});
afterAll(async () => {
  await provider.stop();
});

const USER: ChatMessage = { role: "user", content: "Add it up." };

describe("a finished session whose record was not written, run again", () => {
  test("no sandbox asked for, no engine call, the record written once with its sandbox", async () => {
    const spec = SandboxSpec.parse({ create_url: `${provider.url}/sandboxes/create`, release_url: `${provider.url}/sandboxes/release`, create: "start", ttl_s: 30 });
    const leases = new SandboxLeases(spec, new MemoryLeaseStore(), { trajectoryDeadlineS: 600 });
    const client = new ScriptedClient(tok, [{ text: call("calc", { x: "1" }) }, { text: "#### 1" }]);
    const tools = new FakeTools(["calc"], () => "1");
    const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, tools, reward: false, leases };
    const host = new SessionHost({ storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps) });
    const store = new MemoryTransferQueue();
    const cfg = parseAppConfig({ rollout: { n: 1, max_model_len: 4096 } });
    const rows = [{ uid: "fin", agent_name: "tool_agent", data_source: "test", prompt: [USER] }];
    const submit = (q: TransferQueue) => new RolloutService({ config: cfg, store: q, executorFor: (r, b) => createSessionExecutor(deps, host, q, r, b) }).submit({ rows, global_steps: -1, model_version: null, validate: false });

    // 1. The owner finishes the session and releases the sandbox; its record write fails (it "died" there).
    const dying = delegatingQueue(store, { put: async () => Promise.reject(new Error("the owner died before writing")) });
    const first = submit(dying);
    await first.run.run();
    expect(first.run.stats().counts).toMatchObject({ total: 1, ok: 0 });
    expect((await host.status("fin_0_0"))?.phase).toBe("finished");
    expect(provider.stats()).toMatchObject({ created: 1, live: 0, releases: 1, releases_by_reason: { finished: 1 } });
    const sandboxId = (await leases.sandboxOf("fin_0_0"))!.sandbox_id;
    expect(client.requests.length).toBe(2);

    // 2. Run again (the job reclaimed): the finished outputs are written; nothing is created, released or generated.
    const again = submit(store);
    await again.run.run();
    const recs = again.run.records();
    expect(recs.map((r) => [r.key, r.error, r.extra_fields.sandbox])).toEqual([["fin_0_0", null, { lease_id: "fin_0_0~1", sandbox_id: sandboxId }]]);
    // The first owner's tokens: its tool call opens the response.
    const callIds = tok.encode(call("calc", { x: "1" }));
    expect(recs[0]!.response_ids.slice(0, callIds.length)).toEqual(callIds);
    expect(client.requests.length).toBe(2);
    expect(tools.calls.length).toBe(1);
    expect(provider.stats()).toMatchObject({ created: 1, live: 0, releases: 1, release_not_found: 0 });
    expect((await store.get("fin_0_0"))?.error).toBeNull();
    host.close();
    leases.stop();
  });
});
