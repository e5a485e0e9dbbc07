/**
 * The time bound of a test or hook that starts processes, servers or long
 * runs, in milliseconds: it only catches a hang, it never states how fast
 * anything should be. A child `bun` that loads the tokenizer takes 2 s on a
 * quiet machine and over 20 s on a loaded CI machine (two cores, four test
 * files at once); tests wait on events and counts, and this bound is far past
 * any of them. Equal to the suite's default (`--timeout` in package.json).
 */
export const HANG_MS = 300_000;
