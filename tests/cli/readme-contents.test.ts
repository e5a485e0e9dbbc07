import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

// The README's table of contents (the "Contents:" line after the two opening commands) links every `##` section,
// in order, and each of its links leads to a heading (GitHub's anchors: lower case, punctuation dropped, spaces → -).
const ROOT = join(import.meta.dir, "..", "..");

/** GitHub's anchor of a heading's text. */
const anchor = (heading: string) =>
  heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");

test("the README's contents line links every ## section in order, and every link resolves to a heading", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const lines = readme.split("\n");
  const headings = lines.filter((l) => /^#{2,3} /.test(l)).map((l) => ({ level: l.indexOf(" "), id: anchor(l.replace(/^#+ /, "")) }));
  const contents = lines.find((l) => l.startsWith("**Contents:**"));
  expect(contents).toBeDefined();
  // Before the first section: readers see it without scrolling past the reference.
  expect(lines.indexOf(contents!)).toBeLessThan(lines.findIndex((l) => l.startsWith("## ")));
  const links = [...contents!.matchAll(/\]\(#([^)]+)\)/g)].map((m) => m[1]!);
  const ids = new Set(headings.map((h) => h.id));
  for (const l of links) expect(ids.has(l), l).toBe(true);
  const sections = headings.filter((h) => h.level === 2).map((h) => h.id);
  expect(links.filter((l) => sections.includes(l))).toEqual(sections);
  expect(anchor("Checking an engine first: `edgeloop doctor`")).toBe("checking-an-engine-first-edgeloop-doctor");
});
