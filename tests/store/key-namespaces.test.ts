import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { InputError } from "../../shared/errors.ts";
import { RedisRoutingState } from "../../shared/inference/redis-routing-state.ts";
import { JobQueue } from "../../shared/jobs/job-queue.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { decodeKeyPart, keyPart } from "../../shared/store/key-encoding.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { RedisLayout } from "../../shared/store/redis-layout.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";

// Issue 26 item 3 / audit S4: every Redis key built from input goes through keyPart, so no uid, key,
// batch id, session key or routing key can name another namespace's key, a glob or a hash tag.

/** The Python of tests/clients/python-reader.test.ts (`edgeloop/keys.py` needs only the standard library). */
const PY = process.env.EDGELOOP_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");

/** Ids a client could send: separators, globs, hash-tag braces, CRLF, unicode, the encoding's own escape. */
const HOSTILE = ["g:keys", "g", "g:", ":keys", "*", "g*", "?", "[a]", "{g}", "}{", "{", "a\r\nb", "a b", "\t", "é", "日本", "🙂", "%", "%3A", "g%3Akeys", "agent:g", "traj:g", "a/b", "a\\b", "\u0000", "'\"()!"];
const ORDINARY = ["0b6f2d8e-9c1a-4f7e-8d2b-3a1c5e7f9b0d", "row0", "a.b-c", "row0_1_2", "1700000000000-0", "~x"];

/** Characters that must never appear in an encoded part (Redis key separator, globs, hash tags, whitespace, non-ASCII). */
const FORBIDDEN = /[:{}*?[\]\s\\\u0000-\u001f\u007f-\uffff]/u;

describe("keyPart: one encoding for every key part", () => {
  test("ordinary ids are unchanged (the stored layout of today's uids, keys, UUIDs and stream ids)", () => {
    for (const id of ORDINARY) expect(keyPart(id)).toBe(id);
  });

  test("hostile ids are percent-encoded, injectively, with nothing a key could be split, globbed or tagged by", () => {
    expect(HOSTILE.slice(0, 12).map((h) => keyPart(h))).toEqual(["g%3Akeys", "g", "g%3A", "%3Akeys", "%2A", "g%2A", "%3F", "%5Ba%5D", "%7Bg%7D", "%7D%7B", "%7B", "a%0D%0Ab"]);
    expect(["é", "🙂", "%", "%3A", "'\"()!"].map((h) => keyPart(h))).toEqual(["%C3%A9", "%F0%9F%99%82", "%25", "%253A", "%27%22%28%29%21"]);
    const encoded = [...HOSTILE, ...ORDINARY].map((h) => keyPart(h));
    expect(new Set(encoded).size).toBe(HOSTILE.length + ORDINARY.length);
    for (const e of encoded) expect(FORBIDDEN.test(e)).toBe(false);
    for (const h of [...HOSTILE, ...ORDINARY]) expect(decodeKeyPart(keyPart(h))).toBe(h);
    expect(decodeKeyPart("%zz")).toBeNull();
    expect(decodeKeyPart("%41")).toBeNull(); // "A" encodes as "A": not an output of keyPart
  });

  test("an empty part or a lone surrogate is a 400 naming the field", () => {
    const err = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e instanceof InputError ? [e.status, e.field, e.message] : e;
      }
      return null;
    };
    expect(err(() => keyPart("", "uid"))).toEqual([400, "uid", "uid: must be a non-empty string to form a store key"]);
    expect(err(() => keyPart("a\ud800", "x-session-id"))).toEqual([400, "x-session-id", "x-session-id: is not well-formed Unicode (lone surrogate)"]);
  });

  test("the Python reader's key_part is the same function", () => {
    const ids = [...HOSTILE.filter((h) => h !== "\u0000"), ...ORDINARY];
    const r = Bun.spawnSync([PY, "-c", "import json,sys; sys.path.insert(0, 'clients/python/edgeloop'); from keys import key_part; print(json.dumps([key_part(x) for x in json.load(sys.stdin)]))"], {
      stdin: new TextEncoder().encode(JSON.stringify(ids)),
    });
    expect(r.stderr.toString()).toBe("");
    expect(JSON.parse(r.stdout.toString())).toEqual(ids.map((h) => keyPart(h)));
  });
});

describe("namespace walk: every key builder, every hostile id", () => {
  const P = "ns:";
  const nobody = {} as RedisCommander;
  const layout = new RedisLayout(P);
  const jobs = new JobQueue(nobody, { prefix: P });
  const sessions = new RedisSessionStorage(nobody, { prefix: P });
  const routing = new RedisRoutingState(nobody, { prefix: P });
  /** Namespace name → key of one input. */
  const builders: Record<string, (id: string) => string> = {
    traj: (id) => layout.traj(id),
    group: (id) => layout.group(id),
    "group keys": (id) => layout.members(id),
    stage: (id) => layout.stage(id, "n0"),
    "trajectory session": (id) => sessions.hashKey(keyPart(id)),
    "agent session": (id) => sessions.hashKey(AgentGateway.storageKey(id)),
    "batch hash": (id) => jobs.batchKey(id),
    "batch done": (id) => jobs.doneKey(id),
    "batch rows": (id) => jobs.rowsKey(id),
    "batch reserve": (id) => jobs.reserveKey(id),
    "batch launched": (id) => jobs.launchedKey(id),
    "batch reserve jobs": (id) => jobs.reserveJobsKey(id),
    "batch admitted (batch id)": (id) => jobs.admittedKey(id, "u0"),
    "batch admitted (uid)": (id) => jobs.admittedKey("b0", id),
    "routing pin": (id) => routing.pinKey(id),
  };
  /** Fixed keys that no input may ever produce. */
  const fixed = [layout.stream("train"), layout.stream("val"), layout.filtered("train"), layout.filtered("val"), jobs.stream, jobs.wakeStream, jobs.workersKey, jobs.batchesKey(), routing.healthKey];

  test("no two (namespace, id) pairs share a key, no fixed key is reachable, no key holds a brace, glob or whitespace", () => {
    const seen = new Map<string, string>();
    for (const k of fixed) seen.set(k, "fixed");
    for (const [ns, build] of Object.entries(builders)) {
      for (const id of [...HOSTILE, ...ORDINARY]) {
        const k = build(id);
        const prior = seen.get(k);
        expect(prior === undefined ? null : `${k} from ${prior} and ${ns} ${JSON.stringify(id)}`).toBeNull();
        seen.set(k, `${ns} ${JSON.stringify(id)}`);
        expect(/[{}*?\s]/.test(k.slice(P.length))).toBe(false);
      }
    }
    expect(seen.size).toBe(fixed.length + Object.keys(builders).length * (HOSTILE.length + ORDINARY.length));
  });

  test("ordinary ids keep today's key names byte for byte", () => {
    expect([layout.group("row0"), layout.members("row0"), layout.traj("row0_1_2"), sessions.hashKey("row0_1_2"), sessions.hashKey(AgentGateway.storageKey("row0_1_2")), routing.pinKey("row0_1_2")]).toEqual([
      "ns:group:row0",
      "ns:group:row0:keys",
      "ns:traj:row0_1_2",
      "ns:session:row0_1_2",
      "ns:session:agent:row0_1_2",
      "ns:routing:pin:row0_1_2",
    ]);
    const b = "0b6f2d8e-9c1a-4f7e-8d2b-3a1c5e7f9b0d";
    expect([jobs.batchKey(b), jobs.rowsKey(b), jobs.admittedKey(b, "row0")]).toEqual([`ns:jobs:batch:${b}`, `ns:jobs:batch:${b}:rows`, `ns:jobs:batch:${b}:w:row0`]);
  });
});

/** One record of `uid`'s session `sid` (the key built by hand: hostile uids never pass trajectoryKey). */
function record(uid: string, sid: number) {
  return {
    key: `${uid}_${sid}_0`,
    uid,
    session_id: sid,
    output_index: 0,
    agent_name: "a",
    data_source: "d",
    prompt_ids: [1, 2],
    response_ids: [3],
    response_mask: [1 as const],
    rollout_log_probs: null,
    reward_score: 1,
    num_turns: 1,
    truncated: false,
    finish_reason: "stop" as const,
    error: null,
    metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: 0 },
    extra_fields: {},
  };
}

/**
 * The audit's S4 repro at the store: uid `X:keys` is refused (400 naming `uid`) before anything is
 * written, in both orders, and so is every hostile uid and key on every method; group `X` completes
 * with exactly its records, and no stored key name holds a brace, glob or whitespace.
 */
async function walkStore(store: TransferQueue, tag: string, rawKeys?: () => Promise<string[]>): Promise<void> {
  const refused = async (f: () => Promise<unknown>) => {
    try {
      await f();
    } catch (e) {
      return e instanceof InputError ? [e.status, e.field] : String(e);
    }
    return "accepted";
  };
  const x = `${tag}x`;
  expect(await refused(() => store.expectGroup(`${x}:keys`, 1))).toEqual([400, "uid"]);
  await store.expectGroup(x, 2);
  expect(await refused(() => store.expectGroup(`${x}:keys`, 1))).toEqual([400, "uid"]);
  for (const h of HOSTILE.filter((v) => v !== "g")) {
    const u = `${tag}${h}`;
    expect(await refused(() => store.expectGroup(u, 1))).toEqual([400, "uid"]);
    expect(await refused(() => store.groupStatus(u))).toEqual([400, "uid"]);
    expect(await refused(() => store.finishSession(u, 0, 0))).toEqual([400, "uid"]);
    expect(await refused(() => store.put(record(u, 0) as never))).toEqual([400, "record.uid"]);
    expect(await refused(() => store.get(`${u}_0_0`))).toEqual([400, "key"]);
    expect(await refused(() => store.markFailed(`${u}_0_0`, "x"))).toEqual([400, "key"]);
  }
  for (const sid of [0, 1]) await store.put(record(x, sid) as never);
  expect(await store.groupStatus(x)).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
  const got = await store.readCompleteGroups({ max: 100, consumer: "walk", block_ms: 0 });
  expect(got.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([[x, [`${x}_0_0`, `${x}_1_0`]]]);
  if (rawKeys) for (const k of await rawKeys()) expect(/[{}*?\s]/.test(k)).toBe(false);
}

describe("store walk: hostile uids on memory, Redis and Upstash", () => {
  test("memory", async () => {
    await walkStore(new MemoryTransferQueue(), "m-");
  });

  describe("with Redis", async () => {
    const hasRedis = await requireRedis();
    const base = randomPrefix("keyns");
    const token = `tok-${crypto.randomUUID()}`;
    let bridge: UpstashBridge | undefined;
    const raw = hasRedis ? rawRedis() : undefined;
    beforeAll(async () => {
      if (hasRedis) bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
    });
    afterAll(async () => {
      await bridge?.stop();
      await raw?.quit();
      if (hasRedis) await deleteByPrefix(base);
    });
    test.skipIf(!hasRedis)("redis tcp", async () => {
      const prefix = `${base}tcp:`;
      const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
      try {
        await walkStore(store, "r-", async () => (await raw!.keys(`${prefix}*`)).map((k) => k.slice(prefix.length)));
        expect((await raw!.keys(`${prefix}*`)).sort()).toEqual([`${prefix}group:r-x`, `${prefix}group:r-x:keys`, `${prefix}groups:train`, `${prefix}traj:r-x_0_0`, `${prefix}traj:r-x_1_0`]);
      } finally {
        await store.close();
      }
    });
    test.skipIf(!hasRedis)("upstash rest", async () => {
      const prefix = `${base}up:`;
      const store = createUpstashTransferQueue({ url: bridge!.url, token, retries: 0, prefix });
      try {
        await walkStore(store, "u-", async () => (await raw!.keys(`${prefix}*`)).map((k) => k.slice(prefix.length)));
      } finally {
        await store.close();
      }
    });
  });
});

describe("the API refuses an ambiguous uid, naming it", () => {
  const runtimes: Runtime[] = [];
  afterAll(async () => {
    for (const r of runtimes) await r.close();
  });
  test("POST /v1/rollouts and GET /v1/groups/{uid}", async () => {
    const rt = await buildRuntime({ n: 1, seed: 7 });
    runtimes.push(rt);
    const app = createRolloutsApp({ service: rt.service });
    const res = await app.request("/v1/rollouts", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rows: [{ uid: "gvk2:keys", agent_name: "single_turn_agent", prompt: [{ role: "user", content: "hello" }] }] }),
    });
    // A bad row fails its own trajectory (the batch's convention for row errors), under a uid the server picked.
    expect(res.status).toBe(202);
    const { keys } = (await res.json()) as { keys: string[] };
    expect(keys.length).toBe(1);
    expect(keys[0]!.startsWith("gvk2")).toBe(false);
    let rec: { error: string | null; uid: string } | null = null;
    for (let i = 0; i < 200 && !rec; i++) {
      rec = (await rt.store.get(keys[0]!)) as typeof rec;
      if (!rec) await Bun.sleep(10);
    }
    expect(rec!.error).toBe(`rows[0].uid: "gvk2:keys" refused: uid may only hold letters, digits, '.' and '-' ('_' separates key parts, ':' Redis key words); this row's record is keyed by a server-chosen uid`);
    for (const u of ["gvk2:keys", "%7Bg%7D", "a*"]) {
      const g = await app.request(`/v1/groups/${encodeURIComponent(u)}`);
      expect([g.status, ((await g.json()) as { error: { field: string } }).error.field]).toEqual([400, "uid"]);
    }
  });
});
