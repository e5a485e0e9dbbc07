export * from "./message.ts";
export * from "./tool.ts";
export * from "./row.ts";
export * from "./sampling.ts";
export * from "./config.ts";
export * from "./token-output.ts";
export * from "./agent-loop-output.ts";
export * from "./trajectory-record.ts";
