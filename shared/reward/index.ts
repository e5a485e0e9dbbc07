export * from "./final-answer.ts";
export * from "./rule-reward.ts";
export * from "./webhook-reward.ts";
export * from "./compute-reward.ts";
