/**
 * Polls `cond` every `everyMs` (ms) until it returns true; a condition that
 * throws counts as false. For tests that wait on an event or a count rather
 * than a fixed sleep.
 * @throws Error "timed out waiting for <what>" after `timeoutMs` (ms).
 */
export async function waitFor(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000, everyMs = 10): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await Promise.resolve().then(cond).catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(everyMs);
  }
}
