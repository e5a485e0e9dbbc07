/**
 * `edgeloop/transfer-queue` — the transfer queue trainers read and embedders
 * write (docs/queue-layout.md): the `TransferQueue` contract and its types,
 * Redis over TCP (`createRedisTransferQueue`, ioredis; Bun and Node), Upstash
 * REST (`createUpstashTransferQueue`; any runtime with fetch) and the
 * in-process `MemoryTransferQueue`. Python trainers read the same keys with
 * `clients/python` (the `edgeloop` package).
 */
export * from "../../shared/store/types.ts";
export { createRedisTransferQueue } from "../redis/redis-transfer-queue.ts";
export { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
export { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
export { resolveTree, treeNode, treeNodes, type TreeDelivery } from "../../shared/store/tree-delivery.ts";
