import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Secret } from "kubernetes-models/v1/Secret";
import { Service } from "kubernetes-models/v1/Service";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue } from "../../shared/jobs/job-queue.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { find, K8S_DIR, kedaMode, loadManifests, ROOT } from "./manifests.ts";

// Every manifest in infra/k8s against the Kubernetes and KEDA schemas (kubernetes-models), and the
// wiring between them and the code: the stream and group the ScaledObject watches are the ones a
// worker built from the ConfigMap's config uses.
const SCHEMAS: Record<string, new (body: any) => { validate(): void }> = {
  "v1/ConfigMap": ConfigMap,
  "v1/Secret": Secret,
  "v1/Service": Service,
  "apps/v1/Deployment": Deployment,
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
  "keda.sh/v1alpha1/TriggerAuthentication": TriggerAuthentication,
};

const objs = loadManifests();
const worker = find(objs, "Deployment", "edgeloop-worker");
const scaled = find(objs, "ScaledObject", "edgeloop-worker");
const configMap = find(objs, "ConfigMap", "edgeloop-config");
const secret = find(objs, "Secret", "edgeloop-secrets");
const config = parseAppConfig(parseYaml(configMap.data["config.yaml"]), "infra/k8s/config.yaml");
const deployments = objs.filter((o) => o.kind === "Deployment").map((o) => o.body);

/** The value after `flag` in a container's args. */
const argOf = (args: string[], flag: string): string | undefined => {
  const i = args.indexOf(flag);
  return i < 0 ? undefined : args[i + 1];
};

describe("infra/k8s manifests", () => {
  test("every object is one of the expected kinds and validates against its schema", () => {
    expect(objs.map((o) => `${o.file}:${o.kind}/${o.name}`)).toEqual([
      "config.yaml:ConfigMap/edgeloop-config",
      "gateway.yaml:Deployment/edgeloop-gateway",
      "gateway.yaml:Service/edgeloop-gateway",
      "secrets.yaml:Secret/edgeloop-secrets",
      "serve.yaml:Deployment/edgeloop-serve",
      "serve.yaml:Service/edgeloop-serve",
      "worker.yaml:Deployment/edgeloop-worker",
      "worker.yaml:TriggerAuthentication/edgeloop-redis",
      "worker.yaml:ScaledObject/edgeloop-worker",
    ]);
    for (const o of objs) {
      const Model = SCHEMAS[`${o.body.apiVersion}/${o.kind}`];
      expect(Model, `${o.file}: no schema for ${o.body.apiVersion} ${o.kind}`).toBeDefined();
      expect(() => new Model!(o.body).validate(), `${o.file}: ${o.kind}/${o.name}`).not.toThrow();
    }
  });

  test("the schemas do refuse broken objects (the validation above is not vacuous)", () => {
    const badDeployment = structuredClone(worker);
    badDeployment.spec.template.spec.containers[0].image = 3;
    expect(() => new Deployment(badDeployment).validate()).toThrow("image must be string");
    const badScaled = structuredClone(scaled);
    badScaled.spec.minReplicaCount = "zero";
    expect(() => new ScaledObject(badScaled as any).validate()).toThrow("minReplicaCount must be integer");
    const noTarget = structuredClone(scaled);
    delete noTarget.spec.scaleTargetRef;
    expect(() => new ScaledObject(noTarget as any).validate()).toThrow("scaleTargetRef");
  });

  test("the ScaledObject watches the job stream and group a worker built from the ConfigMap's config uses", async () => {
    expect(config.store.prefix).toBe("edgeloop:");
    // What runtime.ts builds for `edgeloop worker` (new JobQueue(commander, {prefix: config.store.prefix})).
    const commander = new IoRedisCommander("redis://127.0.0.1:6379");
    const jobs = new JobQueue(commander, { prefix: config.store.prefix });
    await commander.close();
    expect(jobs.stream).toBe("edgeloop:jobs");
    expect(jobs.group).toBe("workers");

    const [trigger] = scaled.spec.triggers;
    expect(scaled.spec.triggers.length).toBe(1);
    expect(trigger.type).toBe("redis-streams");
    expect(trigger.metadata.stream).toBe(jobs.stream);
    expect(scaled.metadata.annotations["edgeloop.dev/job-stream"]).toBe(jobs.stream);
    expect(scaled.metadata.annotations["edgeloop.dev/consumer-group"]).toBe(jobs.group);
    // XLEN mode: no consumerGroup key (it would switch KEDA to XPENDING), no lagCount.
    expect(kedaMode(trigger.metadata)).toBe("streamLength");
    expect(Object.keys(trigger.metadata).sort()).toEqual(["stream", "streamLength"]);
    expect(scaled.spec.minReplicaCount).toBe(0);
    expect(scaled.spec.scaleTargetRef.name).toBe(worker.metadata.name);
    // The target is one worker's concurrency: replicas = ceil(XLEN / concurrency).
    expect(Number(trigger.metadata.streamLength)).toBe(config.concurrency);
    // KEDA reaches Redis through the TriggerAuthentication, from Secret keys that exist.
    const auth = find(objs, "TriggerAuthentication", trigger.authenticationRef.name);
    expect(auth.spec.secretTargetRef.map((r: any) => [r.parameter, r.name, r.key])).toEqual([
      ["address", "edgeloop-secrets", "redis-address"],
      ["password", "edgeloop-secrets", "redis-password"],
    ]);
  });

  test("the worker runs `edgeloop worker` without --idle-exit and drains within its grace period", () => {
    const pod = worker.spec.template.spec;
    const args: string[] = pod.containers[0].args;
    expect(args[0]).toBe("worker");
    expect(args).not.toContain("--idle-exit");
    expect(worker.spec.replicas).toBeUndefined();
    const drain = Number(argOf(args, "--drain-timeout"));
    expect(drain).toBe(540);
    // Drain, then a margin for the exit itself, before the kubelet's SIGKILL.
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(drain + 10);
    expect(argOf(args, "--config")).toBe("/etc/edgeloop/config.yaml");
    expect(argOf(args, "--store")).toBe("$(EDGELOOP_REDIS_URL)");
  });

  test("serve runs in queue mode; serve and gateway are probed on /health; every container has requests", () => {
    const serve = find(objs, "Deployment", "edgeloop-serve");
    const gateway = find(objs, "Deployment", "edgeloop-gateway");
    expect(serve.spec.template.spec.containers[0].args.slice(0, 7)).toEqual(["serve", "--host", "0.0.0.0", "--port", "8787", "--jobs", "queue"]);
    expect(gateway.spec.template.spec.containers[0].args[0]).toBe("gateway");
    for (const [d, port] of [[serve, 8787], [gateway, 8080]] as const) {
      const c = d.spec.template.spec.containers[0];
      expect(c.readinessProbe.httpGet).toEqual({ path: "/health", port: "http" });
      expect(c.ports).toEqual([{ name: "http", containerPort: port }]);
      const svc = find(objs, "Service", d.metadata.name);
      expect(svc.spec.selector).toEqual(d.spec.template.metadata.labels);
      expect(svc.spec.ports[0].targetPort).toBe("http");
    }
    for (const d of deployments) {
      expect(d.spec.selector.matchLabels).toEqual(d.spec.template.metadata.labels);
      for (const c of d.spec.template.spec.containers) {
        expect(Object.keys(c.resources.requests).sort(), d.metadata.name).toEqual(["cpu", "memory"]);
        expect(c.resources.limits.memory, d.metadata.name).toBeDefined();
        expect(d.spec.template.spec.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000 });
      }
    }
  });

  test("every $(VAR) in args is an env var of the container, and every secret/config key it reads exists", () => {
    for (const d of deployments) {
      for (const c of d.spec.template.spec.containers) {
        const env = new Set((c.env ?? []).map((e: any) => e.name));
        for (const a of c.args as string[]) for (const m of a.matchAll(/\$\((\w+)\)/g)) expect(env.has(m[1]), `${d.metadata.name}: $(${m[1]})`).toBe(true);
        for (const e of c.env ?? []) {
          const s = e.valueFrom?.secretKeyRef;
          if (s) expect(Object.keys(secret.stringData), `${d.metadata.name}: ${e.name}`).toContain(s.key);
          const m = e.valueFrom?.configMapKeyRef;
          if (m) expect(Object.keys(configMap.data), `${d.metadata.name}: ${e.name}`).toContain(m.key);
        }
        for (const v of d.spec.template.spec.volumes ?? []) if (v.configMap) expect(v.configMap.name).toBe(configMap.metadata.name);
      }
    }
    // S12: no secret in args (they show in /proc/<pid>/cmdline): secrets are read from the environment.
    for (const d of deployments) {
      for (const c of d.spec.template.spec.containers) {
        for (const a of c.args as string[]) expect(a, d.metadata.name).not.toMatch(/secret|token|api-key|TOOLS_SECRET|AGENT_SECRET|API_TOKEN|ADMIN_TOKEN/i);
      }
    }
    // Placeholders only, never real secrets.
    for (const [k, v] of Object.entries(secret.stringData as Record<string, string>)) {
      if (k !== "redis-address") expect(v, k).toContain("REPLACE_ME");
    }
  });

  test("the Dockerfile: official Bun image at package.json's Bun version, committed lockfile, every COPY source exists, non-root, the CLI as entrypoint", async () => {
    const text = readFileSync(join(K8S_DIR, "Dockerfile"), "utf8");
    const lines = text.split("\n").filter((l) => l.trim() && !l.trim().startsWith("#"));
    const froms = lines.filter((l) => l.startsWith("FROM "));
    const bunVersion = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).optionalDependencies.bun.replace(/^\^/, "");
    expect(froms.at(-1)).toBe(`FROM oven/bun:${bunVersion}-slim`);
    const copies = lines.filter((l) => l.startsWith("COPY ") && !l.includes("--from="));
    const sources = copies.flatMap((l) => l.split(/\s+/).slice(1, -1));
    expect(sources).toEqual(["package.json", "package-lock.json", "package.json", "package-lock.json", "shared", "functions", "infra", "examples"]);
    for (const s of sources) expect(existsSync(join(ROOT, s)), s).toBe(true);
    // The lockfile npm ci needs is committed, not just present here.
    const tracked = Bun.spawnSync(["git", "ls-files", "--error-unmatch", "package-lock.json", "package.json"], { cwd: ROOT });
    expect(tracked.exitCode).toBe(0);
    expect(lines).toContain("RUN npm ci --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund");
    expect(lines).toContain("USER 1000:1000");
    expect(lines).toContain('ENTRYPOINT ["bun", "infra/cli/main.ts"]');
    expect(existsSync(join(ROOT, "infra", "cli", "main.ts"))).toBe(true);
    // Everything the CLI imports at run time is inside the copied folders (or node_modules).
    const out = mkdtempSync(join(tmpdir(), "edgeloop-k8s-build-"));
    try {
      const built = Bun.spawnSync([process.execPath, "build", "--target=bun", "--packages=external", "--outdir", out, `--metafile=${join(out, "meta.json")}`, join(ROOT, "infra", "cli", "main.ts")], { cwd: ROOT });
      expect(built.exitCode, built.stderr.toString()).toBe(0);
      const inputs = Object.keys(JSON.parse(readFileSync(join(out, "meta.json"), "utf8")).inputs);
      expect(inputs.length).toBeGreaterThan(100);
      // package.json is copied too (the CLI's --version reads it).
      for (const f of inputs) expect(f === "package.json" || ["shared/", "functions/", "infra/", "examples/"].some((p) => f.startsWith(p)), f).toBe(true);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
