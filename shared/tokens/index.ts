export * from "./tokenizer.ts";
export * from "./prompt.ts";
export * from "./observation.ts";
export * from "./trajectory-builder.ts";
export * from "./validate.ts";
export * from "./token-methods.ts";
