import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { overridesFromFlags } from "../../infra/cli/flags.ts";
import { secretFromEnv } from "../../infra/cli/secrets.ts";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { requireRedis, REDIS_URL } from "../helpers/redis.ts";

// S12 (security audit): secrets come from the environment or from files (mounted secrets), not only
// from argv, where `ps` and /proc/<pid>/cmdline show them; the Upstash bridge compares its token in
// constant time.

const dir = mkdtempSync(join(tmpdir(), "edgeloop-secrets-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string) => {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
};

describe("S12: secretFromEnv", () => {
  test("NAME, else the file NAME_FILE names (one trailing newline dropped), else null", () => {
    expect(secretFromEnv("X_SECRET", { X_SECRET: "direct" })).toBe("direct");
    expect(secretFromEnv("X_SECRET", { X_SECRET_FILE: file("a", "from-file\n") })).toBe("from-file");
    expect(secretFromEnv("X_SECRET", { X_SECRET_FILE: file("b", "crlf\r\n") })).toBe("crlf");
    expect(secretFromEnv("X_SECRET", { X_SECRET_FILE: file("c", " inner spaces kept ") })).toBe(" inner spaces kept ");
    expect(secretFromEnv("X_SECRET", {})).toBeNull();
    expect(secretFromEnv("X_SECRET", { X_SECRET: "", X_SECRET_FILE: "" })).toBeNull();
  });

  test("both set, an unreadable or an empty file: an error naming the variable", () => {
    expect(() => secretFromEnv("X_SECRET", { X_SECRET: "a", X_SECRET_FILE: file("d", "b") })).toThrow("X_SECRET: set either X_SECRET or X_SECRET_FILE, not both");
    expect(() => secretFromEnv("X_SECRET", { X_SECRET_FILE: join(dir, "none") })).toThrow(`X_SECRET_FILE: cannot read ${join(dir, "none")}: ENOENT`);
    expect(() => secretFromEnv("X_SECRET", { X_SECRET_FILE: file("e", "\n") })).toThrow(`X_SECRET_FILE: ${join(dir, "e")} is empty`);
  });

  test("serve/worker/rollout: tools and agent secrets and engine keys from env or files; a flag still wins", () => {
    const env = {
      EDGELOOP_TOOLS_SECRET: "tools-env",
      EDGELOOP_AGENT_SECRET_FILE: file("agent", "agent-file\n"),
      EDGELOOP_ENGINE_API_KEY_FILE: file("engine", "engine-file"),
      EDGELOOP_ENGINE_ADMIN_API_KEY: "admin-env",
    };
    const o = overridesFromFlags({}, env) as { tools: { secret?: string }; agent: { secret?: string }; engine: { api_key?: string; admin_api_key?: string } };
    expect([o.tools.secret, o.agent.secret, o.engine.api_key, o.engine.admin_api_key]).toEqual(["tools-env", "agent-file", "engine-file", "admin-env"]);
    const f = overridesFromFlags({ toolsSecret: "flag-t", agentSecret: "flag-a", engineApiKey: "flag-e" }, env) as typeof o;
    expect([f.tools.secret, f.agent.secret, f.engine.api_key]).toEqual(["flag-t", "flag-a", "flag-e"]);
    const none = overridesFromFlags({}, {}) as typeof o;
    expect([none.tools.secret, none.agent.secret, none.engine.api_key, none.engine.admin_api_key]).toEqual([undefined, undefined, undefined, undefined]);
  });
});

const redis = await requireRedis();
describe.skipIf(!redis)("S12: the Upstash bridge's token", () => {
  test("only the exact bearer token is accepted (prefixes, extensions, same-length guesses: 401)", async () => {
    const token = "bridge-token-0123456789";
    const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
    try {
      const call = (authorization?: string) =>
        fetch(bridge.url, { method: "POST", headers: { "content-type": "application/json", ...(authorization === undefined ? {} : { authorization }) }, body: '["PING"]' });
      for (const a of [undefined, "", `Bearer ${token.slice(0, -1)}`, `Bearer ${token}0`, `Bearer ${token.slice(0, -1)}X`, `bearer ${token}`, token]) {
        const res = await call(a);
        expect([a, res.status, await res.json()]).toEqual([a, 401, { error: "Unauthorized" }]);
      }
      const ok = await call(`Bearer ${token}`);
      expect([ok.status, await ok.json()]).toEqual([200, { result: "PONG" }]);
    } finally {
      await bridge.stop();
    }
  });
});
