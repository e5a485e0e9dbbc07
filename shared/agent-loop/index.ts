export * from "./agent-loop.ts";
export * from "./single-turn-agent.ts";
export * from "./tool-agent.ts";
export * from "./registry.ts";
