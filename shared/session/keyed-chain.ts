/**
 * Runs async operations one at a time per key (in this process), in call
 * order; operations on different keys run concurrently. A failed operation
 * does not stop the next one on its key. The chain of a key is dropped once
 * it is idle, so memory follows the keys in use. Runtime-free.
 */
export class KeyedChain {
  private readonly chains = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier operation on `key`; resolves or rejects as `fn` does. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.chains.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => {});
    this.chains.set(key, tail);
    void tail.then(() => {
      if (this.chains.get(key) === tail) this.chains.delete(key);
    });
    return next;
  }

  /** Keys with an operation running or queued. */
  get size(): number {
    return this.chains.size;
  }
}
