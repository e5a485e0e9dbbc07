import { afterAll, afterEach, beforeAll } from "bun:test";
import { createGatewayApp, type Gateway, type GatewayOptions } from "../../functions/gateway.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/** What {@link gatewayTestbed} gives a test file: the tokenizer, running sim replicas, per-test cleanups, an in-process gateway server. */
export interface GatewayTestbed {
  /** The default tokenizer (read it inside a test or hook: it loads in beforeAll). */
  readonly tok: ChatTokenizer;
  /** The simulated engine's loopback replicas (started in beforeAll, stopped in afterAll). */
  readonly sim: RunningSimEngine;
  /** Run in order and emptied after each test. */
  cleanups: (() => unknown)[];
  /**
   * Serves `createGatewayApp({ replicas, healthIntervalMs: 0, ...gateway, ...opts })`
   * on a loopback port (server `idleTimeout` as given to the testbed); the
   * server is stopped after the test.
   */
  serveGateway(replicas: string[], opts?: Partial<GatewayOptions>): { gw: Gateway; url: string };
}

/**
 * Registers beforeAll (tokenizer, `replicas` sim replicas running `script`),
 * afterEach (the cleanups) and afterAll (the replicas stop). Call it at a
 * file's top level. `gateway`: options every served gateway gets (a test's
 * own options override them); `idleTimeout`: the gateway server's (seconds,
 * 0 = none; default Bun's).
 */
export function gatewayTestbed(o: { script: unknown; replicas: number; gateway?: Partial<GatewayOptions>; idleTimeout?: number }): GatewayTestbed {
  let tok: ChatTokenizer;
  let sim: RunningSimEngine;
  const cleanups: (() => unknown)[] = [];
  beforeAll(async () => {
    tok = await defaultTokenizer();
    sim = await startSimEngine({ replicas: o.replicas, script: o.script, tokenizer: tok });
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0)) await c();
  });
  afterAll(() => sim.stop());
  return {
    get tok() {
      return tok;
    },
    get sim() {
      return sim;
    },
    cleanups,
    serveGateway(replicas, opts = {}) {
      const gw = createGatewayApp({ replicas, healthIntervalMs: 0, ...o.gateway, ...opts });
      const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch, ...(o.idleTimeout === undefined ? {} : { idleTimeout: o.idleTimeout }) });
      cleanups.push(() => server.stop(true));
      return { gw, url: `http://127.0.0.1:${server.port}` };
    },
  };
}
