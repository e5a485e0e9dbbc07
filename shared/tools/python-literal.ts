/**
 * A small reader for the Python literal syntax tool calls use (`[fn(a=1,
 * b="x")]`): strings (both quote kinds, triple quotes, `r` prefixes, escapes,
 * adjacent-literal concatenation), ints and floats (with `_`, hex/octal/binary,
 * signs), `True`/`False`/`None` (and the JSON spellings `true`/`false`/`null`),
 * lists, tuples and dicts. It never evaluates anything: any other expression
 * is a {@link PyLiteralError}.
 *
 * Two departures from Python, both taken from the engines: a raw line break
 * (or any control character) inside a single-quoted string is kept as part of
 * the value instead of being a syntax error — models write multi-line code
 * that way, and the engines' LFM2 pythonic parsers escape such characters
 * before `ast.parse`, which yields exactly the characters the model wrote; and
 * `true`/`false`/`null` read as `True`/`False`/`None`.
 * @see Python `ast.literal_eval`, which vLLM's pythonic parser uses
 * @see vLLM `escape_ctrl_chars_in_strings` and `get_parameter_value` (`vllm/tool_parsers/utils.py`, used by `Lfm2ToolParser.extract_tool_calls`)
 * @see SGLang `_escape_ctrl_chars_in_strings` (`python/sglang/srt/function_call/lfm2_detector.py`)
 */
export class PyLiteralError extends Error {
  constructor(
    message: string,
    readonly pos: number,
  ) {
    super(message);
    this.name = "PyLiteralError";
  }
}

/** One call `name(kw=value, …)` read from the source. */
export interface PyCall {
  name: string;
  kwargs: Record<string, unknown>;
  /** Source range of the call, `[start, end)`. */
  start: number;
  end: number;
}

const MAX_DEPTH = 64;
const SIMPLE_ESCAPES: Record<string, string> = { "\\": "\\", "'": "'", '"': '"', a: "\x07", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t", v: "\v" };

// ASCII is decided by code (in ASCII, \p{L} and \p{N} are exactly the letters and digits); other characters by the regex.
function isIdStart(c: string): boolean {
  const k = c.charCodeAt(0);
  if (k < 128) return (k >= 97 && k <= 122) || (k >= 65 && k <= 90) || k === 95;
  return /[A-Za-z_\p{L}]/u.test(c);
}
function isIdChar(c: string): boolean {
  const k = c.charCodeAt(0);
  if (k < 128) return (k >= 97 && k <= 122) || (k >= 65 && k <= 90) || (k >= 48 && k <= 57) || k === 95;
  return /[A-Za-z0-9_\p{L}\p{N}]/u.test(c);
}

/** Whether the single code unit `c` is one of `rRuUbB` (a string prefix letter). */
function isPrefixLetter(c: string): boolean {
  return c === "r" || c === "R" || c === "u" || c === "U" || c === "b" || c === "B";
}

/** A cursor over `src`; every read method throws {@link PyLiteralError} on bad input. */
export class PyReader {
  pos: number;
  private depth = 0;

  constructor(
    readonly src: string,
    start = 0,
  ) {
    this.pos = start;
  }

  fail(msg: string, at = this.pos): never {
    throw new PyLiteralError(msg, at);
  }

  /** Skips spaces, newlines, backslash line continuations and `#` comments. */
  ws(): void {
    const s = this.src;
    while (this.pos < s.length) {
      const k = s.charCodeAt(this.pos);
      if (k === 32 || k === 9 || k === 10 || k === 13) this.pos++;
      else if (k === 92 && (s[this.pos + 1] === "\n" || s[this.pos + 1] === "\r")) this.pos += 2;
      else if (k === 35) {
        const nl = s.indexOf("\n", this.pos);
        this.pos = nl < 0 ? s.length : nl;
      } else break;
    }
  }

  peek(): string | undefined {
    return this.src[this.pos];
  }

  expect(ch: string): void {
    this.ws();
    if (this.src[this.pos] !== ch) this.fail(this.pos >= this.src.length ? `expected '${ch}' but the text ended` : `expected '${ch}' at offset ${this.pos}`);
    this.pos++;
  }

  /** A (possibly dotted) identifier, e.g. `get_weather` or `functions.get_weather`. */
  identifier(): string {
    this.ws();
    const start = this.pos;
    const s = this.src;
    for (;;) {
      if (this.pos >= s.length || !isIdStart(s[this.pos]!)) this.fail(`expected a name at offset ${this.pos}`);
      while (this.pos < s.length && isIdChar(s[this.pos]!)) this.pos++;
      if (s[this.pos] === "." && this.pos + 1 < s.length && isIdStart(s[this.pos + 1]!)) this.pos++;
      else break;
    }
    return s.slice(start, this.pos);
  }

  /** `name(kw=value, …)`; positional arguments are an error (tools take named parameters). */
  call(): PyCall {
    this.ws();
    const start = this.pos;
    const name = this.identifier();
    this.expect("(");
    const kwargs: Record<string, unknown> = {};
    for (;;) {
      this.ws();
      if (this.peek() === ")") break;
      const at = this.pos;
      const c = this.peek();
      if (c === undefined) this.fail(`the call to '${name}' is not closed with ')'`);
      if (!isIdStart(c)) this.fail(`positional argument at offset ${at} in the call to '${name}'; use keyword arguments (name=value)`);
      const key = this.identifier();
      this.ws();
      if (this.peek() !== "=" || this.src[this.pos + 1] === "=") this.fail(`positional argument at offset ${at} in the call to '${name}'; use keyword arguments (name=value)`);
      this.pos++;
      if (Object.hasOwn(kwargs, key)) this.fail(`keyword argument '${key}' repeated in the call to '${name}'`);
      kwargs[key] = this.value();
      this.ws();
      if (this.peek() === ",") this.pos++;
      else if (this.peek() !== ")") this.fail(this.pos >= this.src.length ? `the call to '${name}' is not closed with ')'` : `expected ',' or ')' at offset ${this.pos} in the call to '${name}'`);
    }
    this.pos++;
    return { name, kwargs, start, end: this.pos };
  }

  /** One literal value, converted to JSON-compatible JS. */
  value(): unknown {
    this.ws();
    if (++this.depth > MAX_DEPTH) this.fail(`literal nested deeper than ${MAX_DEPTH} levels`);
    try {
      return this.valueInner();
    } finally {
      this.depth--;
    }
  }

  private valueInner(): unknown {
    const s = this.src;
    const c = s[this.pos];
    if (c === undefined) this.fail("expected a value but the text ended");
    if (c === "[") return this.sequence("]");
    if (c === "(") return this.sequence(")");
    if (c === "{") return this.dict();
    if (c === '"' || c === "'" || (isPrefixLetter(c) && this.stringPrefixLength() > 0)) return this.strings();
    if ((c >= "0" && c <= "9" && c.length === 1) || c === "." || c === "+" || c === "-") return this.number();
    if (isIdStart(c)) {
      const at = this.pos;
      const id = this.identifier();
      if (id === "True" || id === "true") return true;
      if (id === "False" || id === "false") return false;
      if (id === "None" || id === "null") return null;
      this.fail(`'${id}' at offset ${at} is not a literal (only strings, numbers, True, False, None, lists, tuples and dicts are allowed)`, at);
    }
    this.fail(`unexpected '${c}' at offset ${this.pos}`);
  }

  private sequence(close: string): unknown[] {
    this.pos++;
    const out: unknown[] = [];
    for (;;) {
      this.ws();
      if (this.peek() === close) break;
      out.push(this.value());
      this.ws();
      if (this.peek() === ",") this.pos++;
      else if (this.peek() !== close) this.fail(this.pos >= this.src.length ? `a list is not closed with '${close}'` : `expected ',' or '${close}' at offset ${this.pos}`);
    }
    this.pos++;
    return out;
  }

  private dict(): Record<string, unknown> {
    this.pos++;
    const out: Record<string, unknown> = {};
    for (;;) {
      this.ws();
      if (this.peek() === "}") break;
      const at = this.pos;
      const k = this.value();
      if (k !== null && typeof k === "object") this.fail(`a dict key at offset ${at} must be a string, number, bool or None`, at);
      this.expect(":");
      const v = this.value();
      Object.defineProperty(out, String(k), { value: v, enumerable: true, writable: true, configurable: true });
      this.ws();
      if (this.peek() === ",") this.pos++;
      else if (this.peek() !== "}") this.fail(this.pos >= this.src.length ? "a dict is not closed with '}'" : `expected ',' or '}' at offset ${this.pos}`);
    }
    this.pos++;
    return out;
  }

  private number(): number {
    const s = this.src;
    const start = this.pos;
    let sign = 1;
    while (s[this.pos] === "+" || s[this.pos] === "-") {
      if (s[this.pos] === "-") sign = -sign;
      this.pos++;
      this.ws();
    }
    // Fast path, the same value as the general rule below: `0` or a decimal integer without a leading zero,
    // under 400 characters and finite, followed by none of `0-9 _ . e E x X o O b B j J` nor a name character.
    const k0 = s.charCodeAt(this.pos);
    if (k0 >= 48 && k0 <= 57) {
      let i = this.pos + 1;
      if (k0 !== 48) while (i < s.length && i - this.pos < 400 && s.charCodeAt(i) >= 48 && s.charCodeAt(i) <= 57) i++;
      const next = i < s.length ? s[i]! : "";
      if (i - this.pos < 400 && next !== "." && next !== "_" && (next === "" || !isIdChar(next))) {
        const n = Number(s.slice(this.pos, i));
        if (Number.isFinite(n)) {
          this.pos = i;
          return sign * n;
        }
      }
    }
    const m = /^(?:0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+|(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?)/.exec(s.slice(this.pos, this.pos + 400));
    if (!m) this.fail(`invalid number at offset ${start}`, start);
    const lit = m[0].replace(/_/g, "");
    this.pos += m[0].length;
    if (this.pos < s.length && isIdChar(s[this.pos]!)) this.fail(`invalid number at offset ${start}`, start);
    const n = /^0[xXoObB]/.test(lit) ? Number(lit) : /^0\d/.test(lit) && /^\d+$/.test(lit) && /[1-9]/.test(lit) ? Number.NaN : Number(lit);
    if (!Number.isFinite(n)) this.fail(`invalid number at offset ${start}`, start);
    return sign * n;
  }

  private stringPrefixLength(): number {
    const m = /^(?:[rR][bB]?|[bB][rR]?|[uU])(?=["'])/.exec(this.src.slice(this.pos, this.pos + 3));
    return m ? m[0].length : 0;
  }

  /** One or more adjacent string literals, concatenated as Python does. */
  private strings(): string {
    let out = this.string();
    for (;;) {
      const save = this.pos;
      this.ws();
      const c = this.peek();
      if (c === '"' || c === "'" || (c !== undefined && isPrefixLetter(c) && this.stringPrefixLength() > 0)) out += this.string();
      else {
        this.pos = save;
        return out;
      }
    }
  }

  private string(): string {
    const s = this.src;
    const start = this.pos;
    const plen = this.stringPrefixLength();
    const raw = /[rR]/.test(s.slice(this.pos, this.pos + plen));
    this.pos += plen;
    const q = s[this.pos]!;
    const triple = s.startsWith(q + q + q, this.pos);
    const delim = triple ? q + q + q : q;
    this.pos += delim.length;
    let out = "";
    for (;;) {
      if (this.pos >= s.length) this.fail(`a string starting at offset ${start} is not closed`, start);
      const c = s[this.pos]!;
      if (s.startsWith(delim, this.pos)) {
        this.pos += delim.length;
        return out;
      }
      if (c !== "\\") {
        out += c;
        this.pos++;
        continue;
      }
      const e = s[this.pos + 1];
      if (e === undefined) this.fail(`a string starting at offset ${start} is not closed`, start);
      if (raw) {
        out += c + e;
        this.pos += 2;
        continue;
      }
      this.pos += 2;
      if (e === "\n") continue;
      if (e in SIMPLE_ESCAPES) out += SIMPLE_ESCAPES[e];
      else if (e === "x" || e === "u" || e === "U") {
        const n = e === "x" ? 2 : e === "u" ? 4 : 8;
        const hex = s.slice(this.pos, this.pos + n);
        if (!new RegExp(`^[0-9a-fA-F]{${n}}$`).test(hex)) this.fail(`invalid \\${e} escape at offset ${this.pos - 2}`, this.pos - 2);
        const cp = Number.parseInt(hex, 16);
        if (cp > 0x10ffff) this.fail(`invalid \\${e} escape at offset ${this.pos - 2}`, this.pos - 2);
        out += String.fromCodePoint(cp);
        this.pos += n;
      } else if (/[0-7]/.test(e)) {
        const m = /^[0-7]{0,2}/.exec(s.slice(this.pos, this.pos + 2))![0];
        out += String.fromCodePoint(Number.parseInt(e + m, 8));
        this.pos += m.length;
      } else {
        // Python keeps an unknown escape as written (a backslash and the character).
        out += c + e;
      }
    }
  }
}
