import { checkConfigFile, parseLayeredConfig, type AppConfig } from "../../../shared/config/app-config.ts";
import { InputError } from "../../../shared/errors.ts";
import { readConfigFile, resolveConfigPaths } from "../files.ts";
import { flagConfigError, overridesFromFlags, type ConfigFlags } from "../flags.ts";
import { validateRollout } from "./loops.ts";

/**
 * The process's config: the file (`--config`; relative paths inside it are
 * relative to the file), then the CLI flags over it, validated eagerly. The
 * tool-call parser is checked here unless loop modules are configured (they
 * may register parsers); store flags are refused with the memory store,
 * `--blob-threshold` without a blob store, and an empty `--tools-secret`.
 * @throws ConfigError naming the file's path (a bad value in the file) or the flag; InputError naming the flag.
 */
export async function resolveRuntimeConfig(flags: ConfigFlags): Promise<AppConfig> {
  const fileCfg = flags.config ? resolveConfigPaths(await readConfigFile(flags.config), flags.config) : {};
  let config: AppConfig;
  // The file's own values are checked first, outside the flag attribution below: a bad value in the file
  // is the file's error even when a flag replaces it.
  if (flags.config) checkConfigFile(fileCfg, flags.config);
  try {
    config = parseLayeredConfig(fileCfg, overridesFromFlags(flags), flags.config ?? "flags");
  } catch (e) {
    throw flagConfigError(e, flags);
  }
  // The parser is checked before anything starts, unless loop modules are configured (a module may register
  // its own parser with registerToolCallParser); the default agent loop once the registry is loaded.
  if (!config.rollout.agent.agent_loop_config_path) validateRollout(config.rollout, null);
  // Store flags mean nothing to the memory store (no keys, nothing to reach): refused, not ignored.
  if (config.store.url === "memory") {
    if (flags.storePrefix !== undefined) throw new InputError("--store-prefix", "applies to a Redis or Upstash store (--store); the memory store has no keys");
    if (flags.storeTimeout !== undefined) throw new InputError("--store-timeout", "applies to a Redis or Upstash store (--store); the memory store is never unreachable");
    if (flags.storeShards !== undefined) throw new InputError("--store-shards", "applies to a Redis store (--store); the memory store has no streams to shard");
    if (flags.storeDurability !== undefined) throw new InputError("--store-durability", "applies to a Redis store (--store); the memory store has no replicas");
  }
  // WAIT settings without replicated durability would do nothing: refused, not ignored.
  if (config.store.durability !== "replicated") {
    for (const k of ["wait_replicas", "wait_timeout_ms"] as const) {
      if (config.store[k] !== undefined) throw new InputError(`store.${k}`, "applies with store.durability: replicated (--store-durability replicated); with primary durability no write waits for replicas");
    }
  }
  if (config.store.durability === "replicated" && (config.store.url === "upstash" || config.store.url === "memory")) {
    throw new InputError(flags.storeDurability ? "--store-durability" : "store.durability", `replicated applies to a Redis store over TCP (redis:// or redis+cluster://); ${config.store.url === "upstash" ? "WAIT counts the replicas that acknowledged one connection's writes, and Upstash REST keeps no connection" : "the memory store has no replicas"}`);
  }
  // A threshold without a blob store would keep every part inline, silently.
  if (flags.blobThreshold !== undefined && config.store.blobs.url === null) {
    throw new InputError("--blob-threshold", "applies with a blob store (--blob-store or store.blobs.url); without one every record part stays inline");
  }
  // An empty secret would sign nothing and leave callbacks refused (403): say so instead of running unsigned.
  if (flags.toolsSecret !== undefined && !/\S/.test(flags.toolsSecret)) throw new InputError("--tools-secret", "must not be empty (omit it to run without signatures)");
  return config;
}
