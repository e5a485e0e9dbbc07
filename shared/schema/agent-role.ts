import { z } from "zod";

/**
 * An agent role's name (`X-Agent-Role`, a row's `agent_role`, the keys of
 * config `agent.roles`): 1–64 characters of `[A-Za-z0-9._-]`, so that it is
 * safe in a header, a query parameter and a log line as it is.
 */
export const AgentRoleName = z
  .string()
  .min(1, "an agent role must not be empty")
  .max(64, "an agent role has at most 64 characters")
  .regex(/^[A-Za-z0-9._-]+$/, "an agent role may only hold letters, digits, '.', '_' and '-'");
export type AgentRoleName = z.infer<typeof AgentRoleName>;
