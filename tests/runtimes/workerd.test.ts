import { beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { requireRedis } from "../helpers/redis.ts";
import { awaitRecords, batchRows, checkE4Record, checkRecords, comparableRecord, e4Row, workerdFixture } from "./harness.ts";
import { bunReference } from "./reference.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The Cloudflare entry in workerd: bundled by wrangler from wrangler.toml (as `wrangler deploy` would),
// run by Miniflare with the Durable Object binding on SQLite storage, against loopback services.
const redis = await requireRedis();
const wd = workerdFixture("workerd", { enabled: redis });
let figures: Record<string, number> = {};

beforeAll(() => {
  if (redis) figures = { ...wd.w.figures };
});

describe.skipIf(!redis)("Cloudflare worker + Durable Object sessions in workerd", () => {
  test("the README's Worker size is current: raw and gzip within 2% of what wrangler deploy --dry-run reports for this bundle", () => {
    const readme = readFileSync(join(import.meta.dir, "..", "..", "README.md"), "utf8");
    const row = readme.split("\n").find((l) => l.startsWith("| Worker size (compressed) |"));
    const m = /([\d,]+) KiB raw, \*\*([\d,]+) KiB gzipped\*\* \(wrangler's `Total Upload` line of `wrangler deploy --dry-run/.exec(row ?? "");
    expect(m, "the README's Worker size row").not.toBeNull();
    const [raw, gzip] = [m![1]!, m![2]!].map((v) => Number(v.replaceAll(",", "")));
    const now = `now ${Math.round(figures.upload_kib!).toLocaleString("en-US")} KiB raw, ${Math.round(figures.gzip_kib!).toLocaleString("en-US")} KiB gzipped`;
    expect(Math.abs(raw! / figures.upload_kib! - 1), `README says ${raw} KiB raw; ${now}`).toBeLessThanOrEqual(0.02);
    expect(Math.abs(gzip! / figures.gzip_kib! - 1), `README says ${gzip} KiB gzipped; ${now}`).toBeLessThanOrEqual(0.02);
    // Wrangler's raw figure is the bundle it wrote (KiB = 1024 bytes; the bundle's module plus wrangler's small metadata).
    expect(Math.abs(figures.upload_kib! * 1024 - figures.bundle_bytes!) / figures.bundle_bytes!).toBeLessThan(0.01);
  });

  test("POST /v1/rollouts runs every trajectory in its Durable Object; records land in Redis through the Upstash bridge, identical to Bun's", async () => {
    const health = await wd.mf.dispatchFetch("http://localhost/health");
    expect(await health.json()).toEqual({ ok: true, runtime: "workerd" });
    const rows = batchRows("wd");
    const t0 = performance.now();
    const res = await wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    const body = (await res.json()) as { keys: string[] };
    expect(body.keys).toEqual(["wd0_0_0", "wd0_1_0", "wd1_0_0", "wd1_1_0", "wd2_0_0", "wd2_1_0", "wd3_0_0", "wd3_1_0"]);
    const records = await awaitRecords(wd.s.prefix, ["wd0", "wd1", "wd2", "wd3"], 2);
    figures.batch_ms = performance.now() - t0;
    const calls = checkRecords(records);
    expect(calls).toBe(10);
    const stats = (await (await fetch(`${wd.s.tools.url}/stats`)).json()) as { executions: number };
    expect(stats.executions).toBe(10);
    // A finished session answers status from its object; its record is written once.
    const st = await wd.mf.dispatchFetch("http://localhost/v1/sessions/wd0_0_0");
    expect(await st.json()).toMatchObject({ phase: "done", loop_state: "terminated" });

    const reference = await bunReference(wd.s, rows);
    for (const [key, r] of records) expect(comparableRecord(r)).toEqual(comparableRecord(reference.get(key)!));
    console.log(
      `workerd: bundle ${(figures.bundle_bytes! / 1e6).toFixed(1)} MB built in ${Math.round(figures.bundle_ms!)} ms, runtime up in ${Math.round(figures.start_ms!)} ms, ` +
        `8 trajectories (first request loads the 11 MB tokenizer JSON) in ${Math.round(figures.batch_ms!)} ms`,
    );
  }, HANG_MS);

  test("E4: a turn ended by <|endoftext|> is kept (mask 1) and closed by the observation (<|im_end|>\\n, mask 0), in Durable Objects", async () => {
    const res = await wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [e4Row("wde4")] }) });
    expect(res.status).toBe(202);
    const records = await awaitRecords(wd.s.prefix, ["wde4"], 2);
    expect([...records.keys()]).toEqual(["wde4_0_0", "wde4_1_0"]);
    for (const r of records.values()) checkE4Record(r);
  }, HANG_MS);

  test("E9 in workerd: a known uid with another prompt is a 409 naming it, and the batch registers none of its groups", async () => {
    const post = (rows: unknown[]) => wd.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    const first = await post([{ ...e4Row("wdreuse") }]);
    expect(first.status).toBe(202);
    await awaitRecords(wd.s.prefix, ["wdreuse"], 2);
    const other = { ...e4Row("wdreuse"), prompt: [{ role: "user", content: "What is 3+3?" }] };
    const refused = await post([e4Row("wdfresh"), other]);
    expect(refused.status).toBe(409);
    expect(await refused.json()).toEqual({
      error: {
        code: "conflict",
        message: "rows[1].uid: group wdreuse was registered with another prompt: a uid names one prompt group; use a new uid for new samples",
        field: "rows[1].uid",
      },
    });
    // The refused batch's other row registered nothing (groups are checked before any is written).
    const fresh = (await (await wd.mf.dispatchFetch("http://localhost/v1/groups/wdfresh")).json()) as { expected: number | null; records: number };
    expect([fresh.expected, fresh.records]).toEqual([null, 0]);
    const kept = (await (await wd.mf.dispatchFetch("http://localhost/v1/groups/wdreuse")).json()) as { expected: number; finished: number; records: number; complete: boolean };
    expect([kept.expected, kept.finished, kept.records, kept.complete]).toEqual([2, 2, 2, true]);
  }, HANG_MS);
});
