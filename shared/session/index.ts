export * from "./checkpoint.ts";
export * from "./session-storage.ts";
export * from "./redis-session-storage.ts";
export * from "./trajectory-session.ts";
export * from "./session-host.ts";
export * from "./tool-result-callback.ts";
export * from "./session-queue.ts";
