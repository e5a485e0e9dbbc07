import { EdgeloopError, InputError } from "../../shared/errors.ts";

/** Flags of `edgeloop cancel`. */
export interface CancelFlags {
  /** Base URL of the edgeloop API (default `http://127.0.0.1:8787`, `edgeloop serve`'s). */
  url: string;
}

/**
 * `edgeloop cancel BATCH [--url U]`: `DELETE {U}/v1/rollouts/{BATCH}` with
 * `Authorization: Bearer $EDGELOOP_API_TOKEN` when that is set, and prints
 * the batch's final stats (JSON, one line) on stdout.
 * @throws InputError (exit 2) for a malformed batch id or URL; EdgeloopError (exit 2) with the API's
 *   status, code and message when it refuses (404 unknown batch, 409 already done, 401 token).
 */
export async function cancelCommand(batchId: string, flags: CancelFlags, env: Record<string, string | undefined> = process.env): Promise<void> {
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(batchId)) throw new InputError("BATCH", `'${batchId.slice(0, 100)}' is not a batch id (what POST /v1/rollouts answered)`);
  let base: URL;
  try {
    base = new URL(flags.url);
  } catch {
    throw new InputError("--url", `'${flags.url}' is not a URL`);
  }
  if (base.protocol !== "http:" && base.protocol !== "https:") {
    throw new InputError("--url", `'${flags.url}' is not an http(s) URL`);
  }
  const url = `${base.href.replace(/\/+$/, "")}/v1/rollouts/${encodeURIComponent(batchId)}`;
  const token = env.EDGELOOP_API_TOKEN;
  let res: Response;
  try {
    res = await fetch(url, { method: "DELETE", headers: token ? { authorization: `Bearer ${token}` } : {} });
  } catch (e) {
    throw new EdgeloopError(`DELETE ${url}: ${(e as Error).message}`, { status: 503, code: "unreachable" });
  }
  const text = await res.text();
  if (!res.ok) {
    let said = text.slice(0, 500);
    try {
      const j = JSON.parse(text) as { error?: { code?: string; message?: string } };
      if (j.error?.message) said = `${j.error.code ?? "error"}: ${j.error.message}`;
    } catch {
      // not JSON: the text as it is
    }
    throw new EdgeloopError(`DELETE ${url} answered ${res.status}: ${said}`, { status: res.status, code: "cancel_refused" });
  }
  console.log(JSON.stringify(JSON.parse(text)));
}
