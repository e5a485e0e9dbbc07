/**
 * The simulated engine, runtime-free part (Web APIs and `shared/` only). The
 * Bun server that hosts it is `./server.ts` (`startSimEngine`).
 */
export * from "./script.ts";
export * from "./fault-rate.ts";
export * from "./kv-cache.ts";
export * from "./sim-engine.ts";
export * from "./wire.ts";
export * from "./app.ts";
export * from "./sim-engine-client.ts";
