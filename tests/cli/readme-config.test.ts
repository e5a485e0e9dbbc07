import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import type { z } from "zod";
import { AppConfig, parseAppConfig } from "../../shared/config/app-config.ts";

// The README's configuration example says it sets every key: it must hold exactly the schema's keys
// (every leaf of AppConfig, nested objects walked), and be a valid config.
const README = readFileSync(join(import.meta.dir, "..", "..", "README.md"), "utf8");

/** The schema under wrappers (default, optional, nullable, pipe). */
function unwrap(s: z.ZodType): z.ZodType {
  let t = s as z.ZodType & { def: { type: string; innerType?: z.ZodType; in?: z.ZodType } };
  while (["default", "optional", "nullable", "prefault", "readonly"].includes(t.def.type) || t.def.type === "pipe") {
    t = (t.def.innerType ?? t.def.in) as typeof t;
  }
  return t;
}

/** Every leaf path of an object schema (`rollout.multi_turn.format`, ...); records and arrays are leaves. */
function schemaPaths(s: z.ZodType, prefix = ""): string[] {
  const t = unwrap(s) as z.ZodType & { def: { type: string; shape?: Record<string, z.ZodType> } };
  if (t.def.type !== "object") return [prefix];
  return Object.entries(t.def.shape!).flatMap(([k, v]) => schemaPaths(v, prefix ? `${prefix}.${k}` : k));
}

/** The example's paths, walked as deep as the schema's objects go. */
function examplePaths(v: unknown, s: z.ZodType, prefix = ""): string[] {
  const t = unwrap(s) as z.ZodType & { def: { type: string; shape?: Record<string, z.ZodType> } };
  if (t.def.type !== "object" || v === null || typeof v !== "object") return [prefix];
  return Object.entries(v as Record<string, unknown>).flatMap(([k, x]) =>
    t.def.shape![k] ? examplePaths(x, t.def.shape![k]!, prefix ? `${prefix}.${k}` : k) : [`${prefix ? `${prefix}.` : ""}${k} (not in the schema)`],
  );
}

test("the README's config example sets every key of AppConfig, and only those, and parses", () => {
  const at = README.indexOf("The example below sets every key");
  expect(at).toBeGreaterThan(-1);
  const yaml = /```yaml\n([\s\S]*?)```/.exec(README.slice(at))![1]!;
  const example = parseYaml(yaml) as Record<string, unknown>;
  expect(examplePaths(example, AppConfig).sort()).toEqual(schemaPaths(AppConfig).sort());
  const cfg = parseAppConfig(example, "README");
  expect([cfg.engine.timeout_ms, cfg.engine.model, cfg.store.max_request_bytes, cfg.gateway]).toEqual([
    600_000,
    null,
    null,
    {
      attempt_timeout_ms: null,
      eject_after: 3,
      cooldown_ms: 10_000,
      max_attempts: 3,
      health_interval_ms: 5_000,
      epsilon: null,
      sticky_epsilon: null,
      max_sticky_keys: 10_000,
      shared_state: true,
      lease_ttl_ms: 30_000,
      pin_ttl_ms: 3_600_000,
    },
  ]);
});
