import type { SessionStorage } from "../../shared/session/session-storage.ts";

/**
 * Session storage that "dies" on its `killAt`-th append (1-based): that append throws before writing, the way a
 * process killed between a step and its commit leaves the store. Every other call goes to `inner` unchanged, so a
 * second session opened on `inner` resumes from the last commit that landed. `appends` counts the attempts.
 */
export class DyingStorage implements SessionStorage {
  appends = 0;
  constructor(
    readonly inner: SessionStorage,
    readonly killAt: number,
  ) {}
  get(key: string) {
    return this.inner.get(key);
  }
  async append(key: string, step: number, cp: string, opts?: Parameters<SessionStorage["append"]>[3]) {
    if (++this.appends === this.killAt) throw new Error("killed");
    return this.inner.append(key, step, cp, opts);
  }
  delete(key: string) {
    return this.inner.delete(key);
  }
}
