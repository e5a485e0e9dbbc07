/**
 * Engine idle time during a weight-update cycle: pause → update → resume,
 * as a trainer runs it each step (README "Training loop"), for each pause
 * mode, with trajectories in flight.
 *
 * One simulated replica in its own process, as a real engine is
 * (`bench/pause-engine.ts`: vLLM wire format on loopback, 1 ms per decoded
 * token, turn lengths lognormal with median 1,500 tokens), runs a batch of
 * 32 groups × 8 single-turn trajectories through `buildRuntime` (inline,
 * memory store). 1.5 s into the batch the bench calls `EngineControl.pause`,
 * waits `--update-ms` (the weight update, 200 ms by default), sets the new
 * policy version and calls `resume`. A 1 ms sampler in the engine's process
 * reads how many requests the replica is generating; the replica is idle
 * when none is. Reported per
 * mode:
 * - pause call: how long `pause` took (abort: the gate plus the engine's
 *   abort; wait: until every in-flight call finished);
 * - idle: time with nothing generating, from the pause call to the first
 *   token after resume, and that minus the update (the cycle's overhead);
 * - resume → generating: from the resume call to the first generating request;
 * - drain: in `wait`, the mean number of requests generating while draining
 *   (the batch's concurrency before the pause for comparison);
 * - and, after the batch: requests aborted by the pause (each resumed with
 *   its tokens kept), trajectories failed (must be 0).
 *
 * Run: ./node_modules/.bin/bun bench/pause.ts [--update-ms 200] [--modes abort,wait,keep]  (~1 min)
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { buildRuntime } from "../infra/cli/runtime.ts";
import type { EnginePauseMode } from "../shared/inference/engine-control.ts";

// As `npx edgeloop` runs the CLI: Bun's fetch sends at most 256 requests at once by default, and a
// pause call queued behind 256 generation calls waits for one of them to finish (bin/edgeloop.mjs).
if (!process.env.BUN_CONFIG_MAX_HTTP_REQUESTS) {
  const p = Bun.spawnSync([process.execPath, import.meta.path, ...process.argv.slice(2)], { stdio: ["inherit", "inherit", "inherit"], env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" } });
  process.exit(p.exitCode ?? 1);
}

const { values: args } = parseArgs({ options: { "update-ms": { type: "string", default: "200" }, modes: { type: "string", default: "abort,wait,keep" } } });
const UPDATE_MS = Number(args["update-ms"]);
const MODES = args.modes!.split(",") as EnginePauseMode[];
const GROUPS = 32;
const N = 8;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const dir = mkdtempSync(join(tmpdir(), "edgeloop-pause-"));
const rows = (tag: string) => Array.from({ length: GROUPS }, (_, i) => ({ uid: `${tag}${i}`, prompt: [{ role: "user", content: `Question ${i}: think it through.` }] }));

interface ModeResult {
  mode: EnginePauseMode;
  pauseMs: number;
  idleMs: number;
  resumeToWorkMs: number;
  before: number;
  drainMean: number;
  aborted: number;
  failed: number;
  trajectories: number;
}

/** Epoch milliseconds with sub-millisecond precision (comparable across processes). */
const now = () => performance.timeOrigin + performance.now();

async function cycle(mode: EnginePauseMode): Promise<ModeResult> {
  const child = Bun.spawn([process.execPath, join(import.meta.dir, "pause-engine.ts")], { stdout: "pipe", stderr: "inherit" });
  const reader = child.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("bench/pause-engine.ts exited before listening");
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  const urls = JSON.parse(text.split("\n")[0]!) as { engine: string; control: string };
  const configPath = join(dir, `config-${mode}.json`);
  writeFileSync(
    configPath,
    JSON.stringify({
      concurrency: GROUPS * N,
      engine: { url: urls.engine, format: "vllm" },
      rollout: { n: N, prompt_length: 256, response_length: 8_192, max_model_len: 20_000, agent: { default_agent_loop: "single_turn_agent" } },
    }),
  );
  const rt = await buildRuntime({ config: configPath });
  try {
    await rt.service.policy.set(1);
    const b = await rt.service.accept({ rows: rows(mode), global_steps: 1, model_version: null, validate: false });
    await sleep(1500);
    const t0 = now();
    await rt.engine.pause({ mode, clear_cache: false });
    const t1 = now();
    await sleep(UPDATE_MS);
    await rt.service.policy.set(2);
    const t2 = now();
    await rt.engine.resume();
    await b.run.run();
    const rep = (await (await fetch(`${urls.control}/samples?from=${t0 - 100}`)).json()) as { samples: [number, number][]; aborted: number };
    const samples = rep.samples;
    // The first sample after resume with a request generating: work again.
    const t3 = samples.find(([t, g]) => t >= t2 && g > 0)?.[0] ?? t2;
    // Idle: sampled intervals with nothing generating between the pause call and work again.
    let idle = 0;
    for (let i = 1; i < samples.length; i++) {
      const [t, g] = samples[i - 1]!;
      if (t >= t0 && t < t3 && g === 0) idle += Math.min(samples[i]![0], t3) - t;
    }
    const drain = samples.filter(([t]) => t >= t0 && t < t1);
    const st = b.run.stats();
    return {
      mode,
      pauseMs: t1 - t0,
      idleMs: idle,
      resumeToWorkMs: t3 - t2,
      before: samples.filter(([t]) => t < t0).at(-1)?.[1] ?? 0,
      drainMean: drain.length ? drain.reduce((a, [, g]) => a + g, 0) / drain.length : 0,
      aborted: rep.aborted,
      failed: st.counts.failed,
      trajectories: st.counts.finished,
    };
  } finally {
    await rt.close();
    child.kill();
    await child.exited;
  }
}

try {
  const results: ModeResult[] = [];
  for (const m of MODES) {
    const t = performance.now();
    results.push(await cycle(m));
    console.error(`${m}: done in ${((performance.now() - t) / 1000).toFixed(1)} s`);
  }
  console.log(`update ${UPDATE_MS} ms; one replica, ${GROUPS * N} single-turn trajectories, 1 ms/token, lengths lognormal median 1,500`);
  console.log("mode   pause call  idle (− update)        resume → generating  in flight → draining  aborted+resumed  failed/finished");
  for (const r of results) {
    console.log(
      `${r.mode.padEnd(6)} ${r.pauseMs.toFixed(1).padStart(8)} ms  ${r.idleMs.toFixed(1).padStart(6)} ms (${(r.idleMs - UPDATE_MS).toFixed(1).padStart(6)} ms)  ${r.resumeToWorkMs.toFixed(1).padStart(10)} ms        ${String(r.before).padStart(4)} → ${r.drainMean.toFixed(1).padStart(5)}        ${String(r.aborted).padStart(6)}           ${r.failed}/${r.trajectories}`,
    );
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
