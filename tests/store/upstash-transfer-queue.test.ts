import { afterAll, beforeAll, describe } from "bun:test";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { transferQueueContract } from "./contract.ts";
import { teacherLogProbsContract } from "./teacher-contract.ts";

const hasRedis = await requireRedis();
const base = randomPrefix("store-upstash");
const token = `tok-${crypto.randomUUID()}`;

describe.skipIf(!hasRedis)("upstash rest via the local bridge", () => {
  let bridge: UpstashBridge;
  const raw = rawRedis();
  beforeAll(async () => {
    bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
  });
  afterAll(async () => {
    await bridge.stop();
    await raw.quit();
    await deleteByPrefix(base);
  });
  transferQueueContract(
    "upstash rest",
    {
      open: (opts) => createUpstashTransferQueue({ url: bridge.url, token, retries: 0, ...opts }),
      sharesState: true,
      rawRecord: (prefix, key) => raw.hgetall(`${prefix}traj:${key}`),
      rawKeys: async (prefix) => Object.fromEntries(await Promise.all((await raw.keys(`${prefix}*`)).map(async (k) => [k, await raw.pttl(k)] as const))),
    },
    base,
  );
  teacherLogProbsContract("upstash rest", { open: (opts) => createUpstashTransferQueue({ url: bridge.url, token, retries: 0, ...opts }), sharesState: true, rawRecord: (prefix, key) => raw.hgetall(`${prefix}traj:${key}`) }, base);
});
