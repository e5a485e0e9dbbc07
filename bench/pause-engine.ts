/**
 * The engine side of `bench/pause.ts`, in its own process (as a real engine
 * is): one simulated replica plus a 1 ms sampler of how many requests it is
 * generating. Prints one JSON line `{engine, control}` once listening;
 * `GET {control}/samples?from=EPOCH_MS` answers `{samples: [[epoch_ms, generating], …], aborted}`.
 * Not a benchmark of its own (bench/index.ts skips it).
 */
import { startSimEngine } from "../infra/sim-engine/server.ts";

const sim = await startSimEngine({
  script: { seed: 3, lengths: { median: 1500, sigma: 0.6, min: 16, max: 8000 }, default: ["The answer follows from the steps above."] },
  latency: { decode_ms_per_token: 1 },
  maxModelLen: 20_000,
});
const engine = sim.replicas[0]!.engine;
const samples: [number, number][] = [];
setInterval(() => {
  samples.push([performance.timeOrigin + performance.now(), engine.generating]);
  if (samples.length > 600_000) samples.splice(0, 100_000);
}, 1);
const control = Bun.serve({
  port: 0,
  hostname: "127.0.0.1",
  fetch(req) {
    const from = Number(new URL(req.url).searchParams.get("from") ?? 0);
    return Response.json({ samples: samples.filter((s) => s[0] >= from), aborted: engine.requests.filter((l) => l.finish_reason === "abort").length, pauses: engine.pauses });
  },
});
console.log(JSON.stringify({ engine: sim.urls[0], control: `http://127.0.0.1:${control.port}` }));
