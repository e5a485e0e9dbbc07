import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { tokenSha256 } from "../../shared/agent-gateway/agent-session.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, SP } from "../agent-loop/helpers.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { examplePolicy } from "../helpers/examples.ts";

// Issue 26 / audit S17: an agent session's bearer token is stored as its SHA-256 only (memory, Redis; the
// Durable Object stores what the same gateway gives it) and compared hashed, in constant time.

const script = examplePolicy();
const TOKEN = "elk_0123456789abcdef0123456789abcdef";
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const gatewayOn = (storage: SessionStorage) => new AgentGateway({ storage, tokenizer: tok, client: new SimEngineClient(new SimEngine({ tokenizer: tok, script })), maxModelLen: 4096 });
const input = (token: string) => ({ v: 1 as const, key: "t0_0_0", uid: "t0", session_id: 0, token, created_ms: Date.now(), deadline_ms: Date.now() + 60_000, sampling_params: SP, rollout: config(), tools: [], messages: [{ role: "user" as const, content: "hi" }] });
const status = async (p: Promise<unknown>) => p.then(() => 200, (e: { status?: number }) => e.status ?? 500);

/** Creates a session on `storage`, then checks: stored input hashed, right token passes (also after a re-read), wrong fails, rekey rotates. */
async function scenario(storage: SessionStorage, storedText: () => Promise<string>): Promise<void> {
  const gw = gatewayOn(storage);
  const st = await gw.create(input(TOKEN));
  expect(st.token).toBe(TOKEN);
  const text = await storedText();
  expect(text.includes(TOKEN)).toBe(false);
  expect(text.includes(TOKEN.slice(4))).toBe(false);
  expect(text.includes(await tokenSha256(TOKEN))).toBe(true);
  expect(await status(gw.authorize("t0_0_0", TOKEN))).toBe(200);
  expect(await status(gw.authorize("t0_0_0", TOKEN.replace(/.$/, "0")))).toBe(401);
  expect(await status(gw.authorize("t0_0_0", null))).toBe(401);
  // Another process (a fresh gateway on the same storage) reads the hash back: no token in clear anywhere.
  const other = gatewayOn(storage);
  const again = await other.create(input("elk_another_token_0000000000000000"));
  expect([again.token, again.tokenSha256]).toEqual([undefined, await tokenSha256(TOKEN)]);
  expect(await status(other.authorize("t0_0_0", TOKEN))).toBe(200);
  // A resumed loop that must send the task again rekeys: the old token stops working.
  const NEW = "elk_fedcba9876543210fedcba9876543210";
  expect((await other.rekey("t0_0_0", NEW)).token).toBe(NEW);
  expect([await status(other.authorize("t0_0_0", TOKEN)), await status(other.authorize("t0_0_0", NEW))]).toEqual([401, 200]);
  expect(await status(gatewayOn(storage).authorize("t0_0_0", NEW))).toBe(200);
  expect((await storedText()).includes(NEW)).toBe(false);
}

describe("S17: agent session tokens stored hashed", () => {
  test("memory storage", async () => {
    const storage = new MemorySessionStorage();
    await scenario(storage, async () => JSON.stringify(await storage.get("agent:t0_0_0")));
  });

  test("the HTTP routes authorize with the hash: right token 200, wrong 401", async () => {
    const gw = gatewayOn(new MemorySessionStorage());
    await gw.create(input(TOKEN));
    const app = createAgentGatewayApp({ gateway: gw });
    const call = (t: string) => app.request("/v1/sessions/t0_0_0/openai/v1/models", { headers: { authorization: `Bearer ${t}` } });
    expect([(await call(TOKEN)).status, (await call("elk_wrong_wrong_wrong_wrong_wrong_")).status]).toEqual([200, 401]);
  });

  test("a session stored before (token in clear) still authorizes", async () => {
    const storage = new MemorySessionStorage();
    await storage.append("agent:t0_0_0", 0, JSON.stringify({ e: "open" }), { input: JSON.stringify({ ...input(TOKEN), model_version: null }) });
    const gw = gatewayOn(storage);
    expect([await status(gw.authorize("t0_0_0", TOKEN)), await status(gw.authorize("t0_0_0", "elk_nope_nope_nope_nope"))]).toEqual([200, 401]);
  });

  describe("redis", async () => {
    const hasRedis = await requireRedis();
    const prefix = randomPrefix("s17");
    const raw = hasRedis ? rawRedis() : undefined;
    afterAll(async () => {
      await raw?.quit();
      if (hasRedis) await deleteByPrefix(prefix);
    });
    test.skipIf(!hasRedis)("redis storage: HGETALL of session:agent:{key} holds no token", async () => {
      const cmd = new IoRedisCommander(REDIS_URL);
      try {
        const storage = new RedisSessionStorage(cmd, { prefix });
        await scenario(storage, async () => JSON.stringify(await raw!.hgetall(`${prefix}session:agent:t0_0_0`)));
      } finally {
        await cmd.close();
      }
    });
  });
});
