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
