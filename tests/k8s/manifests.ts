import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";
import type IORedis from "ioredis";

/** The repository root. */
export const ROOT = join(import.meta.dir, "..", "..");
/** Where the Kubernetes manifests live. */
export const K8S_DIR = join(ROOT, "infra", "k8s");

/** One object of a manifest file: its file, kind, name and parsed body. */
export interface ManifestObject {
  file: string;
  kind: string;
  name: string;
  body: Record<string, any>;
}

/** Every object of every `*.yaml` in infra/k8s (multi-document files split), in file order. */
export function loadManifests(): ManifestObject[] {
  const out: ManifestObject[] = [];
  for (const file of readdirSync(K8S_DIR).filter((f) => f.endsWith(".yaml")).sort()) {
    for (const doc of parseAllDocuments(readFileSync(join(K8S_DIR, file), "utf8"))) {
      if (doc.errors.length) throw new Error(`${file}: ${doc.errors[0]!.message}`);
      const body = doc.toJS() as Record<string, any> | null;
      if (!body) continue;
      out.push({ file, kind: String(body.kind), name: String(body.metadata?.name), body });
    }
  }
  return out;
}

/** The one object of `kind` named `name`; throws naming both when absent. */
export function find(objs: ManifestObject[], kind: string, name: string): Record<string, any> {
  const o = objs.find((x) => x.kind === kind && x.name === name);
  if (!o) throw new Error(`no ${kind} ${name} in infra/k8s`);
  return o.body;
}

/** KEDA's redis-streams trigger metadata (strings, as in the ScaledObject). */
export type RedisStreamsTrigger = Record<string, string>;

/** Which metric KEDA's redis-streams scaler computes for a trigger. */
export type KedaMode = "pendingEntriesCount" | "lagCount" | "streamLength";

/**
 * The mode KEDA picks from the trigger's keys: `consumerGroup` with
 * `lagCount` → lag, `consumerGroup` alone → pending entries, no
 * `consumerGroup` → stream length.
 * @see kedacore/keda pkg/scalers/redis_streams_scaler.go, parseRedisStreamsMetadata
 */
export function kedaMode(t: RedisStreamsTrigger): KedaMode {
  if (t.consumerGroup === undefined) return "streamLength";
  return t.lagCount !== undefined ? "lagCount" : "pendingEntriesCount";
}

/**
 * The value KEDA's redis-streams scaler reads for `t`, with the same Redis
 * command: `XLEN stream`; `XPENDING stream group` (its count); or `XINFO
 * GROUPS stream` (the group's `lag`; a NULL lag is -1, as go-redis reads it;
 * a missing stream 0; a missing group falls back to XLEN). `active` is KEDA's
 * activity rule: value > activationLagCount (default 0).
 * @see kedacore/keda pkg/scalers/redis_streams_scaler.go, createEntriesCountFn and GetMetricsAndActivity
 */
export async function kedaMetric(redis: IORedis, t: RedisStreamsTrigger): Promise<{ mode: KedaMode; value: number; active: boolean }> {
  const mode = kedaMode(t);
  const stream = t.stream!;
  let value: number;
  if (mode === "streamLength") value = Number(await redis.xlen(stream));
  else if (mode === "pendingEntriesCount") {
    const r = (await redis.call("XPENDING", stream, t.consumerGroup!)) as [number];
    value = Number(r[0]);
  } else {
    let groups: unknown[][];
    try {
      groups = (await redis.call("XINFO", "GROUPS", stream)) as unknown[][];
    } catch (e) {
      if (/no such key/i.test((e as Error).message)) return { mode, value: 0, active: false };
      throw e;
    }
    const g = groups.map(pairs).find((x) => x.name === t.consumerGroup);
    value = g ? (g.lag === null ? -1 : Number(g.lag)) : Number(await redis.xlen(stream));
  }
  return { mode, value, active: value > Number(t.activationLagCount ?? 0) };
}

function pairs(flat: unknown[]): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) o[String(flat[i])] = flat[i + 1] ?? null;
  return o;
}
