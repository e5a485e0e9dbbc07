import { StoreError } from "../errors.ts";
import type { RedisArg, RedisReply } from "./redis-commander.ts";

/** Upstash's default largest request: 10 MB. @see https://upstash.com/docs/redis/troubleshooting/max_request_size_exceeded */
export const UPSTASH_MAX_REQUEST_BYTES = 10_000_000;
/** Default largest command or pipeline write over Redis TCP: 64 MiB (well under Redis's 512 MB bulk and 1 GB query-buffer limits). */
export const TCP_MAX_REQUEST_BYTES = 64 * 1024 * 1024;

const enc = new TextEncoder();

/** How a transport frames a command: a JSON array (Upstash REST) or RESP (TCP). */
export type Framing = "json" | "resp";

/** Bytes `cmd` takes on the wire as `framing` sends it (JSON: exact; RESP: exact up to the length digits). */
export function commandBytes(cmd: readonly RedisArg[], framing: Framing): number {
  if (framing === "json") {
    let n = 1 + cmd.length; // brackets and commas
    for (const a of cmd) n += typeof a === "string" ? enc.encode(JSON.stringify(a)).byteLength : a.byteLength * 2 + 2;
    return n;
  }
  let n = 16;
  for (const a of cmd) n += 16 + (typeof a === "string" ? (a.length < 1024 ? enc.encode(a).byteLength : utf8Length(a)) : a.byteLength);
  return n;
}

function utf8Length(s: string): number {
  return enc.encode(s).byteLength;
}

/** An upper bound of {@link commandBytes}, from string lengths only (a UTF-16 unit is ≤ 3 UTF-8 bytes, ≤ 6 as a JSON escape). */
function bound(cmd: readonly RedisArg[], framing: Framing): number {
  let n = 16;
  for (const a of cmd) n += 16 + (typeof a === "string" ? a.length : a.byteLength) * (framing === "json" ? 6 : 3);
  return n;
}

/**
 * The error for a single command larger than the transport allows: not
 * retryable (the same command fails the same way), status 413, code
 * `request_too_large`, naming the command and both sizes.
 */
export function tooLarge(cmd: readonly RedisArg[], bytes: number, max: number): StoreError {
  return new StoreError(`store request too large: ${String(cmd[0])} ${typeof cmd[1] === "string" ? cmd[1].slice(0, 120) : ""} is ${bytes} bytes, the limit is ${max} bytes`, {
    retryable: false,
    status: 413,
    code: "request_too_large",
  });
}

/**
 * Splits a pipeline into consecutive runs of at most `max` bytes each (in
 * order), so each run is one request within the limit.
 * @throws StoreError (413, `request_too_large`) when one command alone is over `max`; nothing is sent.
 */
export function splitPipeline(cmds: readonly RedisArg[][], max: number, framing: Framing): RedisArg[][][] {
  let quick = 2;
  for (const c of cmds) quick += bound(c, framing) + 1;
  if (quick <= max) return [cmds as RedisArg[][]];
  const out: RedisArg[][][] = [];
  let cur: RedisArg[][] = [];
  let size = 2;
  for (const c of cmds) {
    const b = commandBytes(c, framing) + 1;
    if (b + 2 > max) throw tooLarge(c, b, max);
    if (cur.length && size + b > max) {
      out.push(cur);
      cur = [];
      size = 2;
    }
    cur.push(c);
    size += b;
  }
  if (cur.length) out.push(cur);
  return out;
}

/**
 * Sends `cmds` as pipelines of at most `max` bytes each, one after another
 * (order kept; not atomic, as a pipeline never is), and returns every reply
 * in order.
 * @throws StoreError (413) before sending anything when one command is over `max`.
 */
export async function pipelineBySize(
  cmds: readonly RedisArg[][],
  max: number,
  framing: Framing,
  send: (batch: RedisArg[][]) => Promise<(RedisReply | Error)[]>,
): Promise<(RedisReply | Error)[]> {
  const batches = splitPipeline(cmds, max, framing);
  if (batches.length === 1) return send(batches[0]!);
  const out: (RedisReply | Error)[] = [];
  for (const b of batches) out.push(...(await send(b)));
  return out;
}

/**
 * Checks one command against `max`.
 * @throws StoreError (413, `request_too_large`) when it is larger.
 */
export function checkCommand(cmd: readonly RedisArg[], max: number, framing: Framing): void {
  if (bound(cmd, framing) <= max) return;
  const b = commandBytes(cmd, framing);
  if (b > max) throw tooLarge(cmd, b, max);
}
