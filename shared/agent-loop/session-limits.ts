import { EdgeloopError, InputError } from "../errors.ts";
import type { GenerateRequest, InferenceClient } from "../inference/types.ts";
import type { TokenOutput } from "../schema/index.ts";

/**
 * The server's per-session bounds (config `limits`, see `LimitsConfig` in
 * shared/config/app-config.ts): outputs (records) and engine calls one session
 * may make, and the range of a self-reported reward (null: unbounded).
 */
export interface SessionLimits {
  maxOutputs: number;
  maxEngineCalls: number;
  rewardMin: number | null;
  rewardMax: number | null;
}

/** The defaults of config `limits`: 128 outputs, 1024 engine calls, any finite reward. */
export const DEFAULT_SESSION_LIMITS: SessionLimits = { maxOutputs: 128, maxEngineCalls: 1024, rewardMin: null, rewardMax: null };

/** {@link SessionLimits} from config `limits` (`max_outputs_per_session`, `max_engine_calls_per_session`, `reward_min`, `reward_max`). */
export function sessionLimitsOf(l: { max_outputs_per_session: number; max_engine_calls_per_session: number; reward_min: number | null; reward_max: number | null }): SessionLimits {
  return { maxOutputs: l.max_outputs_per_session, maxEngineCalls: l.max_engine_calls_per_session, rewardMin: l.reward_min, rewardMax: l.reward_max };
}

/**
 * A session went past a per-session limit: 409, code `session_limit`, `field`
 * the config key (`limits.max_outputs_per_session`, `limits.max_engine_calls_per_session`).
 * Not retryable: the session fails with this message.
 */
export class SessionLimitError extends EdgeloopError {
  override name = "SessionLimitError";
  constructor(key: string, limit: "max_outputs_per_session" | "max_engine_calls_per_session", value: number) {
    const what = limit === "max_outputs_per_session" ? "outputs" : "engine calls";
    super(`session_limit: session '${key.slice(0, 200)}' reached limits.${limit} (${value} ${what}); the session fails`, {
      status: 409,
      code: "session_limit",
      field: `limits.${limit}`,
      retryable: false,
    });
  }
}

/**
 * Checks a self-reported reward (an agent's finish, a task's answer) against
 * the configured range. null passes (no reward: edgeloop scores).
 * @throws InputError (400) naming `field` when it is not finite or outside `[rewardMin, rewardMax]`.
 */
export function checkReward(reward: number | null | undefined, limits: SessionLimits, field = "reward"): void {
  if (reward === null || reward === undefined) return;
  if (typeof reward !== "number" || !Number.isFinite(reward)) throw new InputError(field, "must be a finite number or null");
  if ((limits.rewardMin !== null && reward < limits.rewardMin) || (limits.rewardMax !== null && reward > limits.rewardMax)) {
    throw new InputError(field, `${reward} is outside the configured reward range [${limits.rewardMin ?? "-inf"}, ${limits.rewardMax ?? "inf"}] (limits.reward_min, limits.reward_max)`);
  }
}

/**
 * Fails a session's outputs past `limits.maxOutputs` (a custom loop that
 * returned more records than one session may write).
 * @throws SessionLimitError
 */
export function checkOutputCount(key: string, count: number, limits: SessionLimits): void {
  if (count > limits.maxOutputs) throw new SessionLimitError(key, "max_outputs_per_session", limits.maxOutputs);
}

/**
 * The engine client of one session: forwards every call until
 * `limits.maxEngineCalls` were made, then refuses the next with
 * {@link SessionLimitError} (no request sent). One wrapper per session run.
 */
export class SessionCallLimiter implements InferenceClient {
  /** Engine calls made through this wrapper so far. */
  calls = 0;
  constructor(
    private readonly inner: InferenceClient,
    private readonly key: string,
    private readonly limits: SessionLimits,
  ) {}
  generate(req: GenerateRequest): Promise<TokenOutput> {
    if (this.calls >= this.limits.maxEngineCalls) return Promise.reject(new SessionLimitError(this.key, "max_engine_calls_per_session", this.limits.maxEngineCalls));
    this.calls++;
    return this.inner.generate(req);
  }
  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
  servableLength(contextLen: number): number {
    return this.inner.servableLength ? this.inner.servableLength(contextLen) : contextLen;
  }
}
