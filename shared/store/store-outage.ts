import pRetry from "p-retry";
import { EdgeloopError, StoreError, type EdgeloopErrorOptions } from "../errors.ts";

/** Stable code of {@link StoreUnreachableError}. */
export const STORE_UNREACHABLE = "store_unreachable";

/**
 * The store cannot be reached at all (connection refused or lost, REST
 * endpoint down): an outage, as opposed to an error Redis answered (those
 * stay plain {@link StoreError}s). Thrown by the commanders
 * (infra/redis/ioredis-commander.ts, UpstashCommander); work that needs the
 * store is held and retried while this lasts ({@link holdWhileStoreDown}).
 */
export class StoreUnreachableError extends StoreError {
  override name = "StoreUnreachableError";
  /** Its message names the store (password masked) and says it is unreachable: shown in the 503 body, as `/health` does. */
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { code: STORE_UNREACHABLE, retryable: true, ...opts });
  }
}

/** Whether `e` (or an error in its `cause` chain) is a {@link StoreUnreachableError}: decided by `code`, not message text. */
export function isStoreOutage(e: unknown): boolean {
  return storeOutageOf(e) !== undefined;
}

/** The store-outage error in `e`'s `cause` chain (code `store_unreachable`), or undefined. */
export function storeOutageOf(e: unknown): EdgeloopError | undefined {
  for (let x: unknown = e, i = 0; x != null && i < 6; x = (x as { cause?: unknown }).cause, i++) {
    if (x instanceof EdgeloopError && x.code === STORE_UNREACHABLE) return x;
    if (typeof x !== "object") break;
  }
  return undefined;
}

/** Options of {@link holdWhileStoreDown}. */
export interface HoldOptions {
  /** Retries of a retryable failure that is not an outage (default 4: five attempts, as before). */
  retries?: number;
  /** First delay, milliseconds (default 50); grows ×3 per attempt. */
  minTimeoutMs?: number;
  /** Longest delay between attempts, milliseconds (default 5000): the backoff cap. */
  maxTimeoutMs?: number;
  /** Called after each failed attempt (e.g. one log line per outage). */
  onRetry?: (error: unknown, attempt: number) => void;
}

/**
 * Runs `fn`, retrying with capped exponential backoff (p-retry): for as long
 * as the store is unreachable ({@link isStoreOutage}) — an outage holds the
 * work, it never fails it — and at most `retries` times for other retryable
 * failures (`retryable !== false`). A process that must not wait forever
 * bounds the outage itself (`--store-timeout`, which exits).
 * @throws the last error once a non-outage failure is out of retries, or at once when it is not retryable.
 * @see https://github.com/sindresorhus/p-retry
 */
export function holdWhileStoreDown<T>(fn: () => Promise<T>, opts: HoldOptions = {}): Promise<T> {
  const limit = opts.retries ?? 4;
  let others = 0;
  return pRetry(fn, {
    retries: Number.POSITIVE_INFINITY,
    minTimeout: opts.minTimeoutMs ?? 50,
    factor: 3,
    maxTimeout: opts.maxTimeoutMs ?? 5_000,
    onFailedAttempt: ({ error, attemptNumber }) => opts.onRetry?.(error, attemptNumber),
    shouldRetry: ({ error }) => {
      if (isStoreOutage(error)) return true;
      if ((error as { retryable?: boolean }).retryable === false) return false;
      return ++others <= limit;
    },
  });
}
