import { ConfigError, formatPath } from "../../shared/errors.ts";
import { fnv1a32, hashInt, unitFloat } from "../../shared/inference/hash.ts";
import { SimFaultRate, type SimFaultRateInput } from "./script.ts";

/** What a fault-rate draw decided for one request (undefined: answer normally). */
export type FaultRateDecision = { kind: "http_500" | "http_503" } | { kind: "abort_after"; tokens: number } | undefined;

/** One fault the engine actually injected (an `abort_after` that came too late to cut the turn is not one). */
export interface SimInjectedFault {
  kind: "http_500" | "http_503" | "abort";
  /** The request's routing key (`X-Session-ID`: the trajectory key, for edgeloop's agent loops). */
  routing_key?: string;
  request_id: string;
  /** 0-based: how many requests with this routing key and prompt came before. */
  attempt: number;
  /** Assistant-turn index of the request. */
  turn_index: number;
  /** `abort`: tokens generated before the abort. */
  tokens?: number;
}

/** Counters of an injector: requests drawn for and faults injected, by kind. */
export interface FaultRateCounts {
  requests: number;
  http_500: number;
  http_503: number;
  abort: number;
}

/** 32-bit hash of a request's identity: its routing key and prompt ids. */
export function requestHash(routingKey: string | undefined, prompt: readonly number[]): number {
  let h = fnv1a32(routingKey ?? "");
  for (let i = 0; i < prompt.length; i++) h = hashInt(h, prompt[i]!);
  return hashInt(h, prompt.length);
}

/**
 * The deterministic fault function: u = unit(hash(seed, request hash, attempt));
 * u < errors → `http_500`/`http_503` (a second draw picks which, evenly);
 * u < errors + aborts → `abort_after` k, k uniform in [0, max_abort_tokens].
 * Pure: the chaos driver can recompute which requests a run would fault.
 */
export function faultRateDecision(spec: SimFaultRate, seed: number, reqHash: number, attempt: number): FaultRateDecision {
  const h = hashInt(hashInt(hashInt(0x9e3779b9, seed), reqHash), attempt);
  const u = unitFloat(h);
  if (u < spec.errors) return { kind: unitFloat(hashInt(h, 1)) < 0.5 ? "http_500" : "http_503" };
  if (u < spec.errors + spec.aborts) return { kind: "abort_after", tokens: Math.floor(unitFloat(hashInt(h, 2)) * (spec.max_abort_tokens + 1)) };
  return undefined;
}

const LOG_LIMIT = 100_000;
const ATTEMPTS_LIMIT = 200_000;

/**
 * Probabilistic fault injection shared by the replicas of one simulated
 * engine (so a retry that lands on another replica is still the next
 * attempt). Counts attempts per (routing key, prompt) and keeps a log of
 * every fault injected (the last 100,000), by routing key.
 */
export class FaultRateInjector {
  readonly spec: SimFaultRate;
  readonly seed: number;
  /** Faults injected, oldest first. */
  readonly injected: SimInjectedFault[] = [];
  readonly counts: FaultRateCounts = { requests: 0, http_500: 0, http_503: 0, abort: 0 };
  private readonly attempts = new Map<string, number>();

  /** @throws ConfigError naming the bad field (`fault_rate.errors`…). */
  constructor(spec: SimFaultRateInput | SimFaultRate, seed: number) {
    const r = SimFaultRate.safeParse(spec);
    if (!r.success) {
      const first = r.error.issues[0];
      throw new ConfigError(formatPath("fault_rate", first?.path ?? []), first?.message ?? "invalid fault rate", { cause: r.error });
    }
    this.spec = r.data;
    this.seed = r.data.seed ?? seed;
  }

  /** Draws for one request (counting it as the next attempt of its routing key and prompt). */
  draw(routingKey: string | undefined, prompt: readonly number[]): { decision: FaultRateDecision; attempt: number } {
    const h = requestHash(routingKey, prompt);
    const id = `${routingKey ?? ""}\u0000${h}`;
    const attempt = this.attempts.get(id) ?? 0;
    if (this.attempts.size >= ATTEMPTS_LIMIT) this.attempts.clear();
    this.attempts.set(id, attempt + 1);
    this.counts.requests++;
    return { decision: faultRateDecision(this.spec, this.seed, h, attempt), attempt };
  }

  /** Logs a fault that was injected. */
  record(f: SimInjectedFault): void {
    this.counts[f.kind]++;
    this.injected.push(f);
    if (this.injected.length > LOG_LIMIT) this.injected.splice(0, this.injected.length - LOG_LIMIT);
  }
}
