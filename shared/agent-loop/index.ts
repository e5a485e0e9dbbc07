export * from "./agent-loop.ts";
export * from "./single-turn-agent.ts";
export * from "./tool-agent.ts";
export * from "./registry.ts";
export { OpenEnvAgentLoop, openEnvSettingsFor, type OpenEnvLink, type OpenEnvTerminatedBy } from "./openenv-agent.ts";
export { OpenEnvError, type OpenEnvEpisode, type OpenEnvSocket, type OpenEnvSocketFactory } from "./openenv-client.ts";
export { isDeadlineAbort, TrajectoryDeadlineError } from "./trajectory-deadline.ts";
