import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseMoeFlag } from "../../infra/cli/engine-commands.ts";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { ConfigError } from "../../shared/errors.ts";

const tmp = mkdtempSync(join(tmpdir(), "edgeloop-experts-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function cfg(name: string, yaml: string): string {
  const p = join(tmp, name);
  writeFileSync(p, yaml);
  return p;
}

describe("rollout.return_routed_experts at start", () => {
  test("refused with a vLLM format (naming the field), and with SGLang but no engine.moe", async () => {
    for (const format of ["vllm", "vllm-generate"]) {
      const e = await buildRuntime({ config: cfg(`${format}.yaml`, `rollout: {return_routed_experts: true}\nengine: {url: "http://127.0.0.1:1", format: ${format}}\n`) }).catch((x) => x);
      expect(e).toBeInstanceOf(ConfigError);
      expect(e.field).toBe("rollout.return_routed_experts");
      expect(e.message).toStartWith("config rollout.return_routed_experts: is not supported with engine.format vllm or vllm-generate");
    }
    const s = await buildRuntime({ config: cfg("sglang.yaml", `rollout: {return_routed_experts: true}\nengine: {url: "http://127.0.0.1:1", format: sglang}\n`) }).catch((x) => x);
    expect(s).toBeInstanceOf(ConfigError);
    expect(s.field).toBe("engine.moe");
    // Simulated replicas behind the gateway speak the configured format: vLLM is refused there too.
    const sim2 = await buildRuntime({ config: cfg("sim2.yaml", `rollout: {return_routed_experts: true}\nengine: {replicas: 2, format: vllm}\n`) }).catch((x) => x);
    expect(sim2).toBeInstanceOf(ConfigError);
    expect(sim2.field).toBe("rollout.return_routed_experts");
  });

  test("engine.moe is validated eagerly", async () => {
    const e = await buildRuntime({ config: cfg("moe.yaml", `engine: {moe: {layers: 0, top_k: 2}}\n`) }).catch((x) => x);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toContain("engine.moe.layers must be >= 1");
    const k = await buildRuntime({ config: cfg("moe2.yaml", `engine: {moe: {layers: 2, top_k: 4, num_experts: 2}}\n`) }).catch((x) => x);
    expect(k.message).toContain("engine.moe.num_experts must be >= top_k");
  });
});

test("edgeloop sim-engine --moe layers,top_k[,num_experts]", () => {
  expect(parseMoeFlag("48,8,128")).toEqual({ layers: 48, top_k: 8, num_experts: 128 });
  expect(parseMoeFlag("2, 2")).toEqual({ layers: 2, top_k: 2 });
  for (const bad of ["48", "0,2", "4,8,4", "a,b"]) {
    const e = (() => {
      try {
        parseMoeFlag(bad);
      } catch (x) {
        return x as ConfigError;
      }
    })();
    expect(e).toBeInstanceOf(ConfigError);
    expect(e!.message).toBe(`config --moe: expected layers,top_k[,num_experts] (integers >= 1, num_experts >= top_k), got '${bad}'`);
  }
});
