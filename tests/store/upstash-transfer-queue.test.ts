import { describe } from "bun:test";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { randomPrefix, requireRedis } from "../helpers/redis.ts";
import { upstashBridgeFixture } from "../helpers/upstash-bridge.ts";
import { transferQueueContract } from "./contract.ts";
import { teacherLogProbsContract } from "./teacher-contract.ts";

const hasRedis = await requireRedis();
const base = randomPrefix("store-upstash");
const token = `tok-${crypto.randomUUID()}`;

describe.skipIf(!hasRedis)("upstash rest via the local bridge", () => {
  const bridge = upstashBridgeFixture({ token, prefix: base });
  const raw = bridge.raw;
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
