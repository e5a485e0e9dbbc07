/**
 * Whether the UTF-16 code unit `c` is a JavaScript blank: WhiteSpace or
 * LineTerminator, the set `/\s/` matches and `String.prototype.trim` removes
 * (tab, LF, VT, FF, CR, space, NBSP, U+1680, U+2000–U+200A, U+2028, U+2029,
 * U+202F, U+205F, U+3000, U+FEFF). Decided by code, without a regex per character.
 * @see ECMAScript §12.2 White Space and §12.3 Line Terminators
 */
export function isBlank(c: number): boolean {
  if (c === 32 || (c >= 9 && c <= 13)) return true;
  if (c < 128) return false;
  return c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000 || c === 0xfeff;
}

/** The index after the blanks ({@link isBlank}) that start at `from` (as `trimStart` would cut them). */
export function skipBlanks(text: string, from: number): number {
  let i = from;
  while (i < text.length && isBlank(text.charCodeAt(i))) i++;
  return i;
}

/** The index where the blanks ({@link isBlank}) that end at `to` begin, no lower than `floor` (as `trimEnd` would cut them). */
export function skipBlanksBack(text: string, to: number, floor: number): number {
  let i = to;
  while (i > floor && isBlank(text.charCodeAt(i - 1))) i--;
  return i;
}
