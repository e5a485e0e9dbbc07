import { afterAll, describe } from "bun:test";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { transferQueueContract } from "./contract.ts";
import { teacherLogProbsContract } from "./teacher-contract.ts";

const hasRedis = await requireRedis();
const base = randomPrefix("store-redis-tcp");

describe.skipIf(!hasRedis)("redis tcp (ioredis)", () => {
  const raw = rawRedis();
  afterAll(async () => {
    await raw.quit();
    await deleteByPrefix(base);
  });
  transferQueueContract(
    "redis tcp",
    {
      open: (opts) => createRedisTransferQueue({ url: REDIS_URL, ...opts }),
      sharesState: true,
      rawRecord: (prefix, key) => raw.hgetall(`${prefix}traj:${key}`),
      rawKeys: async (prefix) => Object.fromEntries(await Promise.all((await raw.keys(`${prefix}*`)).map(async (k) => [k, await raw.pttl(k)] as const))),
    },
    base,
  );
  teacherLogProbsContract("redis tcp", { open: (opts) => createRedisTransferQueue({ url: REDIS_URL, ...opts }), sharesState: true, rawRecord: (prefix, key) => raw.hgetall(`${prefix}traj:${key}`) }, base);
});
