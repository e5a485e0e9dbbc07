import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { ConfigError, formatPath, InputError } from "../errors.ts";
import { AgentLoopOutput, type SamplingParams } from "../schema/index.ts";
import type { AgentLoop, AgentLoopContext, AgentLoopKwargs } from "./agent-loop.ts";

/** Makes a loop for one trajectory. */
export type AgentLoopFactory = (ctx: AgentLoopContext) => AgentLoop;

/** A class extending {@link AgentLoop}, or a factory function. */
export type AgentLoopExport = (new (ctx: AgentLoopContext) => AgentLoop) | AgentLoopFactory;

/** One entry of `agent.agent_loop_config_path`: a loop `name`, the `module` to import, and the `export` holding the loop. */
export const AgentLoopConfigEntry = z.strictObject({
  name: z.string().min(1),
  module: z.string().min(1),
  export: z.string().min(1).default("default"),
});
export type AgentLoopConfigEntry = z.infer<typeof AgentLoopConfigEntry>;

/**
 * Parses an agent-loop config file (YAML or JSON): a list of
 * `{name, module, export}` (or `{agent_loops: [...]}`); unknown keys and a
 * name given twice are refused, as everywhere in the config.
 * @throws ConfigError naming the file and the entry's field.
 */
export function parseAgentLoopConfig(text: string, source = "agent.agent_loop_config_path"): AgentLoopConfigEntry[] {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (e) {
    throw new ConfigError(source, `not valid YAML or JSON: ${(e as Error).message}`, { cause: e });
  }
  const list = doc && typeof doc === "object" && !Array.isArray(doc) && "agent_loops" in doc ? (doc as { agent_loops: unknown }).agent_loops : doc;
  const r = z.array(AgentLoopConfigEntry).safeParse(list);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new ConfigError(`${source}: ${formatPath("", i.path) || "(root)"}`, i.message);
  }
  const first = new Map<string, number>();
  for (const [i, e] of r.data.entries()) {
    const j = first.get(e.name);
    if (j !== undefined) throw new ConfigError(`${source}: [${i}].name`, `'${e.name}' is already the name of entry [${j}]: each agent loop name may appear once`);
    first.set(e.name, i);
  }
  return r.data;
}

function isClass(x: AgentLoopExport): x is new (ctx: AgentLoopContext) => AgentLoop {
  return typeof x === "function" && typeof (x as { prototype?: { run?: unknown } }).prototype?.run === "function";
}

/**
 * Maps `agent_name` → loop. Built with the built-ins `single_turn_agent` and
 * `tool_agent` (see {@link defaultAgentLoopRegistry}); custom loops come from
 * {@link AgentLoopRegistry.loadConfig} at start-up, overriding built-ins of the
 * same name (as verl does).
 * @see verl `register` / `agent_loop_config_path` (verl spec §3.7)
 */
export class AgentLoopRegistry {
  private readonly loops = new Map<string, AgentLoopFactory>();

  /** Registers a loop class or factory under `name` (replacing one of the same name). */
  register(name: string, loop: AgentLoopExport): this {
    this.loops.set(name, isClass(loop) ? (ctx) => new loop(ctx) : (loop as AgentLoopFactory));
    return this;
  }

  /** Registered names, sorted. */
  names(): string[] {
    return [...this.loops.keys()].sort();
  }

  has(name: string): boolean {
    return this.loops.has(name);
  }

  /**
   * The loop name a row routes to (case C14): `agent_name` absent or null →
   * `defaultName`; a registered name → itself.
   * @throws InputError (field `agent_name`) for an unknown name, listing the registered ones.
   */
  resolve(agentName: string | null | undefined, defaultName: string): string {
    const name = agentName ?? defaultName;
    if (!this.loops.has(name)) {
      throw new InputError("agent_name", `unknown agent loop '${name}'; registered agent loops: ${this.names().join(", ")}`);
    }
    return name;
  }

  /** A new loop instance for `name` (already resolved). */
  create(name: string, ctx: AgentLoopContext): AgentLoop {
    const f = this.loops.get(name);
    if (!f) throw new InputError("agent_name", `unknown agent loop '${name}'; registered agent loops: ${this.names().join(", ")}`);
    return f(ctx);
  }

  /**
   * Registers custom loops from config entries, importing each module once
   * (`importModule` defaults to dynamic `import()`; relative `module` paths
   * resolve against `baseUrl`, e.g. the config file's `file://` URL).
   * @throws ConfigError when a module cannot be imported or its export is not a loop class or factory.
   */
  async loadConfig(
    entries: readonly AgentLoopConfigEntry[],
    opts: { baseUrl?: string; importModule?: (specifier: string) => Promise<Record<string, unknown>> } = {},
  ): Promise<this> {
    const importModule = opts.importModule ?? ((s: string) => import(/* @vite-ignore */ s) as Promise<Record<string, unknown>>);
    for (const [i, e] of entries.entries()) {
      const spec = opts.baseUrl && (e.module.startsWith("./") || e.module.startsWith("../")) ? new URL(e.module, opts.baseUrl).href : e.module;
      let mod: Record<string, unknown>;
      try {
        mod = await importModule(spec);
      } catch (err) {
        throw new ConfigError(`agent.agent_loop_config_path[${i}].module`, `cannot import '${e.module}' for agent loop '${e.name}': ${(err as Error).message}`, { cause: err });
      }
      const exp = mod[e.export];
      if (typeof exp !== "function") {
        throw new ConfigError(`agent.agent_loop_config_path[${i}].export`, `'${e.module}' has no function or class export '${e.export}' for agent loop '${e.name}'`);
      }
      this.register(e.name, exp as AgentLoopExport);
    }
    return this;
  }
}


/**
 * Routes one row to its loop and runs it: `kwargs.agent_name` (absent/null →
 * `config.agent.default_agent_loop`) is resolved first, so an unknown name
 * fails the row before any request is sent (C14); then a fresh loop instance
 * runs. Always returns a list (one output per trajectory the loop produced).
 * @throws InputError for an unknown `agent_name` or a bad row; whatever the loop throws.
 */
export async function runAgentLoop(
  registry: AgentLoopRegistry,
  ctx: AgentLoopContext,
  samplingParams: SamplingParams,
  kwargs: AgentLoopKwargs,
): Promise<AgentLoopOutput[]> {
  const name = registry.resolve(kwargs.agent_name, ctx.config.agent.default_agent_loop);
  return loopOutputs(name, await registry.create(name, ctx).run(samplingParams, kwargs));
}

/** What a loop's output must be, token arrays aside (they are checked with plain loops by the validator, not zod). */
// `teacher_log_probs` is edgeloop's to set after the loop (rollout.teacher): a loop's own is dropped here.
const OutputScalars = AgentLoopOutput.omit({ prompt_ids: true, response_ids: true, response_mask: true, response_logprobs: true, teacher_log_probs: true, routed_experts: true });

function isTokenArray(v: unknown): boolean {
  return Array.isArray(v) || (ArrayBuffer.isView(v) && !(v instanceof DataView));
}

/**
 * A loop's return value as a list of outputs, each checked for shape before
 * anything reads it: an object with `prompt_ids`, `response_ids`,
 * `response_mask` arrays, `response_logprobs` an array or null,
 * `routed_experts` an array when present, and the
 * scalar fields of {@link AgentLoopOutput} (defaults applied). Values inside
 * the arrays are checked later by `validateTrajectory`.
 * @throws InputError naming the loop and `output_index` (`agent_loop 'x' output[1].response_ids: expected an array`).
 */
export function loopOutputs(agentName: string, out: unknown): AgentLoopOutput[] {
  const list = Array.isArray(out) ? out : [out];
  return list.map((o, i) => {
    const where = `agent_loop '${agentName}' output[${i}]`;
    if (typeof o !== "object" || o === null) throw new InputError(where, `expected an AgentLoopOutput object, got ${o === null ? "null" : typeof o}`);
    const rec = o as Record<string, unknown>;
    for (const f of ["prompt_ids", "response_ids", "response_mask"] as const) {
      if (!isTokenArray(rec[f])) throw new InputError(`${where}.${f}`, `expected an array of token ${f === "response_mask" ? "mask values" : "ids"}, got ${rec[f] === null ? "null" : typeof rec[f]}`);
    }
    if (rec.response_logprobs !== null && rec.response_logprobs !== undefined && !isTokenArray(rec.response_logprobs)) {
      throw new InputError(`${where}.response_logprobs`, `expected an array or null, got ${typeof rec.response_logprobs}`);
    }
    if (rec.routed_experts !== undefined && !isTokenArray(rec.routed_experts)) {
      throw new InputError(`${where}.routed_experts`, `expected an array of expert ids or absent, got ${rec.routed_experts === null ? "null" : typeof rec.routed_experts}`);
    }
    const r = OutputScalars.safeParse(o);
    if (!r.success) {
      const issue = r.error.issues[0]!;
      throw new InputError(formatPath(where, issue.path), issue.message);
    }
    return {
      ...r.data,
      prompt_ids: rec.prompt_ids,
      response_ids: rec.response_ids,
      response_mask: rec.response_mask,
      response_logprobs: rec.response_logprobs ?? null,
      // Values are checked by the validator (routed_experts): length (P + R) · layers · top_k, int32 ≥ −1.
      ...(rec.routed_experts !== undefined ? { routed_experts: rec.routed_experts } : {}),
    } as AgentLoopOutput;
  });
}
