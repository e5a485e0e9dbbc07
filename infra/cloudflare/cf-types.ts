/**
 * The slice of the Workers runtime API this entry uses, typed locally (the
 * project does not depend on `@cloudflare/workers-types`).
 * @see https://developers.cloudflare.com/durable-objects/api/
 */

/** Durable Object storage (async KV API; on SQLite-backed objects too). */
export interface DurableObjectStorage {
  get<T = unknown>(key: string): Promise<T | undefined>;
  get<T = unknown>(keys: string[]): Promise<Map<string, T>>;
  put(entries: Record<string, unknown>): Promise<void>;
  put(key: string, value: unknown): Promise<void>;
  delete(keys: string[]): Promise<number>;
  deleteAll(): Promise<void>;
  setAlarm(when: number | Date): Promise<void>;
  getAlarm(): Promise<number | null>;
  deleteAlarm(): Promise<void>;
}

/** `ctx` of a Durable Object. */
export interface DurableObjectState {
  storage: DurableObjectStorage;
  id: { toString(): string; name?: string };
  waitUntil(p: Promise<unknown>): void;
  blockConcurrencyWhile<T>(fn: () => Promise<T>): Promise<T>;
}

/** A stub to one Durable Object. */
export interface DurableObjectStub {
  fetch(input: string | Request, init?: RequestInit): Promise<Response>;
}

/** A Durable Object namespace binding. */
export interface DurableObjectNamespace {
  idFromName(name: string): unknown;
  get(id: unknown): DurableObjectStub;
}

/** What `fetch` handlers get besides the request. */
export interface ExecutionContext {
  waitUntil(p: Promise<unknown>): void;
}

/** An R2 object's metadata (what `put`/`head` return). */
export interface R2Object {
  key: string;
  size: number;
}

/** An R2 object with its body (what `get` returns). */
export interface R2ObjectBody extends R2Object {
  arrayBuffer(): Promise<ArrayBuffer>;
}

/**
 * An R2 bucket binding (wrangler.toml `r2_buckets`).
 * @see https://developers.cloudflare.com/r2/api/workers/workers-api-reference/
 */
export interface R2Bucket {
  put(key: string, value: ArrayBuffer | ArrayBufferView | string, options?: { sha256?: string | ArrayBuffer; httpMetadata?: { contentType?: string } }): Promise<R2Object | null>;
  get(key: string): Promise<R2ObjectBody | null>;
  delete(keys: string | string[]): Promise<void>;
  list(options?: { prefix?: string; cursor?: string; limit?: number }): Promise<{ objects: R2Object[]; truncated: boolean; cursor?: string }>;
}
