import { existsSync } from "node:fs";
import { chromium, type Browser } from "playwright-core";

/** Debian's Chromium (`apt-get install chromium`), or `CHROMIUM_PATH`. */
export const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
/** Whether {@link CHROMIUM} is installed (browser tests skip without it, except under CI). */
export const HAVE_CHROMIUM = existsSync(CHROMIUM);

/**
 * Launches {@link CHROMIUM} headless through playwright-core with the flags this machine needs: no
 * sandbox (root), no GPU, and no background networking, component updates or first-run requests
 * (the closed network refuses them, many at a time).
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"] });
}
