import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { Hono } from "hono";
import { createSimEngineApp, type SimWireOptions } from "./app.ts";
import { FaultRateInjector } from "./fault-rate.ts";
import { parseSimScript, type SimFault, type SimFaultRateInput } from "./script.ts";
import { SimEngine, type SimLatency } from "./sim-engine.ts";
import { listen } from "../cli/listen.ts";

/** Options of {@link startSimEngine}. */
export interface StartSimEngineOptions {
  /** First port; replica i listens on `port + i`. 0 (default) = a free port per replica. */
  port?: number;
  /** Interface to bind (default 127.0.0.1). */
  hostname?: string;
  /** Number of replicas K (default 1): K servers, each with its own engine and KV cache. */
  replicas?: number;
  /** Scripted policy (parsed or raw JSON value); default `DEFAULT_POLICY`. */
  script?: unknown;
  /** Tokenizer (default Qwen3's `defaultTokenizer()`). */
  tokenizer?: ChatTokenizer;
  model?: string;
  maxModelLen?: number;
  kvCacheBlocks?: number;
  latency?: SimLatency;
  /** MoE shape of the simulated model (routed experts); default `DEFAULT_SIM_MOE`. */
  moe?: { layers: number; top_k: number; num_experts?: number };
  /** Per-replica faults, by replica index. */
  faults?: (SimFault | undefined)[];
  /**
   * Probabilistic faults over all replicas (one injector, so attempts are
   * counted across them; default: the script's `fault_rate`). Read what was
   * injected from `replicas[0].engine.faultRate`.
   */
  faultRate?: SimFaultRateInput;
  /** Seed of the replicas' prompt log-probs (a simulated teacher; see `SimEngineOptions.scoreSeed`). */
  scoreSeed?: number;
  /** How the simulated servers were started: engine version, keys, vLLM flags (see {@link SimWireOptions}). */
  wire?: SimWireOptions;
}

/** One served replica: its engine, app and server, which a test can kill and revive. */
export interface SimReplica {
  url: string;
  port: number;
  engine: SimEngine;
  app: Hono;
  /** Stops the server (in-flight connections are cut): callers then see connection refused. */
  kill(): Promise<void>;
  /** Serves again on the same port (the engine and its cache survive). */
  revive(): void;
  /** Whether it is serving. */
  readonly alive: boolean;
}

/** A running simulated engine: K replicas. */
export interface RunningSimEngine {
  /** Base URL of each replica, e.g. `http://127.0.0.1:41234`. */
  urls: string[];
  replicas: SimReplica[];
  /** Stops every replica. */
  stop(): Promise<void>;
}

/**
 * Starts K simulated-engine replicas with `Bun.serve`, one port each (the CLI's
 * `edgeloop sim-engine --port P --replicas K --script FILE`). The idle timeout
 * is disabled so a `hang` fault lasts until the client gives up.
 * @throws ConfigError for a bad script or fault
 */
export async function startSimEngine(opts: StartSimEngineOptions = {}): Promise<RunningSimEngine> {
  const tokenizer = opts.tokenizer ?? (await defaultTokenizer());
  const k = opts.replicas ?? 1;
  if (!Number.isInteger(k) || k < 1) throw new RangeError(`replicas must be an integer ≥ 1, got ${k}`);
  const hostname = opts.hostname ?? "127.0.0.1";
  const replicas: SimReplica[] = [];
  const rateSpec = opts.faultRate ?? (opts.script === undefined ? undefined : parseSimScript(opts.script).fault_rate);
  const faultRate = rateSpec ? new FaultRateInjector(rateSpec, opts.script === undefined ? 1 : parseSimScript(opts.script).seed) : undefined;
  try {
    for (let i = 0; i < k; i++) {
      const engine = new SimEngine({
        tokenizer,
        script: opts.script,
        name: `replica-${i}`,
        model: opts.model,
        maxModelLen: opts.maxModelLen,
        kvCacheBlocks: opts.kvCacheBlocks,
        latency: opts.latency,
        moe: opts.moe,
        fault: opts.faults?.[i],
        faultRate,
        ...(opts.scoreSeed !== undefined ? { scoreSeed: opts.scoreSeed } : {}),
      });
      replicas.push(serveReplica(engine, hostname, opts.port ? opts.port + i : 0, opts.wire));
    }
  } catch (e) {
    await Promise.all(replicas.map((r) => r.kill()));
    throw e;
  }
  return {
    urls: replicas.map((r) => r.url),
    replicas,
    stop: async () => {
      await Promise.all(replicas.map((r) => r.kill()));
    },
  };
}

function serveReplica(engine: SimEngine, hostname: string, port: number, wire?: SimWireOptions): SimReplica {
  const app = createSimEngineApp(engine, wire);
  const serve = (p: number) => listen({ hostname, port: p, fetch: app.fetch });
  let server: ReturnType<typeof Bun.serve> | undefined = serve(port);
  const actualPort = server.port as number;
  return {
    url: `http://${hostname}:${actualPort}`,
    port: actualPort,
    engine,
    app,
    get alive() {
      return server !== undefined;
    },
    async kill() {
      const s = server;
      server = undefined;
      if (s) await s.stop(true);
    },
    revive() {
      if (!server) server = serve(actualPort);
    },
  };
}
