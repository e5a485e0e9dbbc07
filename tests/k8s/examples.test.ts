/**
 * What `kubectl apply -f infra/k8s/` runs besides edgeloop itself: no example tool server (the config names its
 * tools file, as shipped the example's URLs, served only by the opt-in examples/example-tools.yaml), a Redis only
 * from the opt-in examples/redis.yaml (its start-up script run here for real), and the Kubernetes version the
 * manifests' `preStop.sleep` needs, stated in the README.
 */
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import IORedis from "ioredis";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Service } from "kubernetes-models/v1/Service";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { StatefulSet } from "kubernetes-models/apps/v1/StatefulSet";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { freePort } from "../helpers/redis-server.ts";
import { CONFIG_DIR, EXAMPLE_TOOLS_URL } from "./harness.ts";
import { find, K8S_DIR, loadManifests, ROOT, type ManifestObject } from "./manifests.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const EXAMPLES_DIR = join(K8S_DIR, "examples");
const objs = loadManifests();
const examples: ManifestObject[] = readdirSync(EXAMPLES_DIR)
  .filter((f) => f.endsWith(".yaml"))
  .sort()
  .flatMap((file) =>
    parseAllDocuments(readFileSync(join(EXAMPLES_DIR, file), "utf8")).map((d) => {
      const body = d.toJS() as Record<string, any>;
      return { file, kind: String(body.kind), name: String(body.metadata?.name), body };
    }),
  );
const configMap = find(objs, "ConfigMap", "edgeloop-config");
const secret = find(objs, "Secret", "edgeloop-secrets");
const config = parseAppConfig(parseYaml(configMap.data["config.yaml"]), "infra/k8s/config.yaml");
const containersOf = (o: ManifestObject) => (o.body.spec?.template?.spec?.containers ?? []) as Record<string, any>[];

describe("infra/k8s: examples only on request", () => {
  test("the applied manifests run no example server; the config names its tools file, which the ConfigMap holds where the pods mount it", () => {
    for (const o of objs) for (const c of containersOf(o)) expect(["tools", "agent-example", "sim-engine", "sandbox-provider"], `${o.file}: ${c.name}`).not.toContain(c.args[0]);
    // tools.file set: runtime.ts starts the in-process example tool server only when it is null.
    expect(config.tools.file).toBe(`${CONFIG_DIR}tools.json`);
    for (const name of ["edgeloop-serve", "edgeloop-worker"]) {
      const pod = find(objs, "Deployment", name).spec.template.spec;
      const mount = pod.containers[0].volumeMounts.find((m: any) => m.mountPath === CONFIG_DIR.slice(0, -1));
      expect(pod.volumes.find((v: any) => v.name === mount.name).configMap.name, name).toBe("edgeloop-config");
    }
    const file = parseToolsFile(configMap.data["tools.json"], { source: "infra/k8s/config.yaml tools.json" });
    expect(file.tools.map((t) => t.name)).toEqual(["calc", "lookup"]);
    expect(file.interactions.map((i) => i.name)).toEqual(["gsm8k_user"]);
    for (const u of [...file.tools, ...file.interactions].map((t) => t.url)) expect(u.startsWith(`${EXAMPLE_TOOLS_URL}/`), u).toBe(true);
    // The same tools as the in-process example (infra/tools/tools.example.json), URLs aside.
    const example = parseToolsFile(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8"), { vars: { port: 1 } });
    const strip = (f: typeof file) => ({ tools: f.tools.map(({ url: _u, ...t }) => t), interactions: f.interactions.map(({ url: _u, ...i }) => i) });
    expect(strip(file)).toEqual(strip(example));
    // The comment above tools.json says so, in capitals.
    expect(readFileSync(join(K8S_DIR, "config.yaml"), "utf8")).toContain("AS SHIPPED\n  # IT NAMES THE EXAMPLE TOOLS");
  });

  test("the examples validate; the example tool server's Service is the host tools.json names, signed with the Secret's tools-secret", () => {
    expect(examples.map((o) => `${o.file}:${o.kind}/${o.name}`)).toEqual([
      "example-tools.yaml:Deployment/edgeloop-example-tools",
      "example-tools.yaml:Service/edgeloop-example-tools",
      "redis.yaml:StatefulSet/redis",
      "redis.yaml:Service/redis",
    ]);
    const SCHEMAS: Record<string, new (body: any) => { validate(): void }> = { Deployment, Service, StatefulSet, ConfigMap };
    for (const o of examples) expect(() => new SCHEMAS[o.kind]!(o.body).validate(), `${o.file}: ${o.kind}`).not.toThrow();
    const tools = examples.find((o) => o.kind === "Deployment")!;
    const svc = examples.find((o) => o.kind === "Service" && o.name === "edgeloop-example-tools")!.body;
    expect(EXAMPLE_TOOLS_URL).toBe(`http://${svc.metadata.name}:${svc.spec.ports[0].port}`);
    expect(svc.spec.selector).toEqual(tools.body.spec.template.metadata.labels);
    const c = containersOf(tools)[0]!;
    expect(c.args).toEqual(["tools", "--host", "0.0.0.0", "--port", String(svc.spec.ports[0].port)]);
    expect(c.env).toEqual([{ name: "EDGELOOP_TOOLS_SECRET", valueFrom: { secretKeyRef: { name: "edgeloop-secrets", key: "tools-secret" } } }]);
    expect(tools.body.metadata.labels["app.kubernetes.io/component"]).toBe("example-tools");
  });

  test("the example Redis is the Secret's redis-address; its start-up script, run here, requires the password and keeps noeviction and appendonly", async () => {
    const set = examples.find((o) => o.kind === "StatefulSet")!.body;
    const svc = examples.find((o) => o.kind === "Service" && o.name === "redis")!.body;
    expect(`${svc.metadata.name}:${svc.spec.ports[0].port}`).toBe(secret.stringData["redis-address"]);
    expect(new URL(secret.stringData["redis-url"]).host).toBe(secret.stringData["redis-address"]);
    expect(svc.spec.selector).toEqual(set.spec.template.metadata.labels);
    const c = set.spec.template.spec.containers[0];
    expect(c.env).toEqual([{ name: "REDIS_PASSWORD", valueFrom: { secretKeyRef: { name: "edgeloop-secrets", key: "redis-password" } } }]);
    expect(c.command).toEqual(["sh", "-c"]);
    const script: string = c.args[0];
    expect(c.volumeMounts.map((m: any) => m.mountPath).sort()).toEqual(["/data", "/run/redis"]);

    // The script with the pod's two mounts in a temp dir, on a free loopback port (appended: a later flag wins).
    const dir = mkdtempSync(join(tmpdir(), "edgeloop-k8s-redis-"));
    const port = await freePort();
    const local = script.replaceAll("/run/redis", dir).replaceAll("/data", dir) + ` --port ${port} --bind 127.0.0.1`;
    const proc = Bun.spawn(["sh", "-c", local], { env: { ...process.env, REDIS_PASSWORD: "k8s-example-pw" }, stdout: "pipe", stderr: "pipe" });
    let out = "";
    try {
      const reader = proc.stdout.getReader();
      const dec = new TextDecoder();
      while (!out.includes("Ready to accept connections")) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`redis-server exited: ${out}${await new Response(proc.stderr).text()}`);
        out += dec.decode(value);
      }
      reader.releaseLock();
      // The password is in the config file, not on redis-server's command line.
      const cmdline = readFileSync(`/proc/${proc.pid}/cmdline`, "utf8");
      expect(cmdline).toContain("redis-server");
      expect(cmdline).not.toContain("k8s-example-pw");
      // Without the password a plain PING is refused (a raw RESP exchange: ioredis opens with HELLO).
      const anon = await new Promise<string>((resolve, reject) => {
        Bun.connect({
          hostname: "127.0.0.1",
          port,
          socket: { open: (sock) => void sock.write("PING\r\n"), data: (sock, d) => {
              resolve(d.toString());
              sock.end();
            }, error: (_sock, e) => reject(e) },
        }).catch(reject);
      });
      expect(anon).toStartWith("-NOAUTH");
      const r = new IORedis({ port, host: "127.0.0.1", password: "k8s-example-pw", maxRetriesPerRequest: 0 });
      expect(await r.ping()).toBe("PONG");
      expect(await r.config("GET", "maxmemory-policy")).toEqual(["maxmemory-policy", "noeviction"]);
      expect(await r.config("GET", "appendonly")).toEqual(["appendonly", "yes"]);
      await r.call("SHUTDOWN", "NOSAVE").catch(() => {});
      r.disconnect();
      expect(await proc.exited).toBe(0);
    } finally {
      proc.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
    }
  }, HANG_MS);

  test("the README states the Kubernetes version the manifests' preStop.sleep needs (the PodLifecycleSleepAction feature: beta, on by default, in 1.30)", () => {
    const sleeping = objs.filter((o) => containersOf(o).some((c) => c.lifecycle?.preStop?.sleep)).map((o) => o.file);
    expect(sleeping).toEqual(["gateway.yaml", "serve.yaml"]);
    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    expect(readme).toContain("Kubernetes 1.30 or later: `serve.yaml` and `gateway.yaml` use `lifecycle.preStop.sleep`");
    for (const f of sleeping) expect(readFileSync(join(K8S_DIR, f), "utf8"), f).toContain("Kubernetes 1.30");
  });
});
