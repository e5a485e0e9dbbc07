import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import { parseAppConfig, type AppConfig } from "../../shared/config/app-config.ts";
import { REDIS_URL } from "../helpers/redis.ts";
import { find, loadManifests, ROOT } from "./manifests.ts";

/** The CLI entry the image runs (ENTRYPOINT ["bun", "infra/cli/main.ts"]). */
export const MAIN = join(ROOT, "infra", "cli", "main.ts");

const objs = loadManifests();
const configMap = find(objs, "ConfigMap", "edgeloop-config");
/** The ConfigMap's config.yaml, as text and parsed by edgeloop's own config parser. */
export const CONFIG_TEXT: string = configMap.data["config.yaml"];
export const CONFIG: AppConfig = parseAppConfig(parseYaml(CONFIG_TEXT), "infra/k8s/config.yaml");
/** The worker Deployment's container args and the ScaledObject's trigger metadata. */
export const WORKER_ARGS: string[] = find(objs, "Deployment", "edgeloop-worker").spec.template.spec.containers[0].args;
export const TRIGGER: Record<string, string> = find(objs, "ScaledObject", "edgeloop-worker").spec.triggers[0].metadata;

/** Where the pods mount the ConfigMap (serve.yaml, worker.yaml, gateway.yaml). */
export const CONFIG_DIR = "/etc/edgeloop/";
/** The example tool server's base URL as the ConfigMap's tools.json names it (examples/example-tools.yaml's Service). */
export const EXAMPLE_TOOLS_URL = "http://edgeloop-example-tools:8123";

/**
 * Writes the ConfigMap's files into `dir` as the pod mounts them at
 * /etc/edgeloop (config.yaml with its /etc/edgeloop/ paths pointed at
 * `dir`, tools.json with the example tool server's URL replaced by
 * `toolsUrl`: a tool server the test started, standing in for the example's
 * Service); returns config.yaml's path.
 */
export function writeConfig(dir: string, toolsUrl: string): string {
  for (const [key, text] of Object.entries(configMap.data as Record<string, string>)) {
    writeFileSync(join(dir, key), text.replaceAll(CONFIG_DIR, join(dir, "/")).replaceAll(EXAMPLE_TOOLS_URL, toolsUrl));
  }
  return join(dir, "config.yaml");
}

/**
 * The trigger as it would read for a deployment whose store.prefix is
 * `prefix` (tests run under a random prefix on the shared Redis): the
 * manifest's stream with the ConfigMap's prefix replaced.
 */
export function triggerFor(prefix: string): Record<string, string> {
  if (!TRIGGER.stream!.startsWith(CONFIG.store.prefix)) throw new Error(`trigger stream ${TRIGGER.stream} is not under store.prefix ${CONFIG.store.prefix}`);
  return { ...TRIGGER, stream: prefix + TRIGGER.stream!.slice(CONFIG.store.prefix.length) };
}

/**
 * The worker container's args as the pod runs them, for a test: `$(VAR)`s
 * filled in (the Redis URL, a tools secret), the config path pointed at
 * `configPath`, then `extra` flags (which win: commander keeps the last
 * value), e.g. `--store-prefix`, `--engine`, `--consumer`.
 */
export function workerArgs(configPath: string, extra: string[] = [], over: Record<string, string> = {}): string[] {
  const vars: Record<string, string> = { EDGELOOP_REDIS_URL: REDIS_URL, EDGELOOP_TOOLS_SECRET: "k8s-test-secret" };
  const args = WORKER_ARGS.map((a) => (a === "/etc/edgeloop/config.yaml" ? configPath : a.replace(/\$\((\w+)\)/g, (_, v: string) => vars[v] ?? "")));
  for (const [flag, value] of Object.entries(over)) {
    const i = args.indexOf(flag);
    if (i < 0) throw new Error(`worker args have no ${flag}`);
    args[i + 1] = value;
  }
  return [...args, ...extra];
}

/** A spawned `edgeloop worker` with its output collected. */
export interface WorkerProc {
  name: string;
  proc: ReturnType<typeof Bun.spawn>;
  /** Resolves to {code, stdout, stderr} once it exited. */
  done: Promise<{ code: number; stdout: string; stderr: string }>;
}

/** Starts `bun infra/cli/main.ts <args>` (the image's entrypoint) as a worker named `name`. */
export function spawnWorker(name: string, args: string[]): WorkerProc {
  const proc = Bun.spawn([process.execPath, MAIN, ...args, "--consumer", name], { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  const done = (async () => {
    const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout as ReadableStream).text(), new Response(proc.stderr as ReadableStream).text(), proc.exited]);
    return { code, stdout, stderr };
  })();
  return { name, proc, done };
}
