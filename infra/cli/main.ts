/**
 * The `edgeloop` command line (run as `npx edgeloop …` after `npm install`).
 * Subcommands: rollout, serve, worker, cancel, gc, inspect, doctor, sim-engine, gateway, tools, agent-example, sandbox-provider, upstash-bridge.
 * Every subcommand's flags are listed by `edgeloop <cmd> --help`.
 * With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans go to that OTLP/HTTP collector
 * (flushed when the command ends).
 *
 * Exit codes: 0 done; 1 a run that produced nothing (every trajectory
 * failed), a failing `doctor` check, or an unexpected error; 2 bad flags (any flag or argument commander
 * or a flag parser refuses: one line naming the flag), bad config, an
 * unreachable store, a port in use; 130 interrupted (SIGINT/SIGTERM during `rollout`). An error
 * prints one line `edgeloop: …`; `EDGELOOP_DEBUG=1` adds the stack trace.
 */
import { Command, CommanderError, Option } from "commander";
import { EdgeloopError } from "../../shared/errors.ts";
import { setupTelemetryFromEnv, type Telemetry } from "../telemetry/setup.ts";
import { durationFlag, intFlag, MAX_TIMER_SECONDS, msFlag, msPerTokenFlag, portFlag as port, positiveNumberFlag, secondsFlag, versionFlag } from "./flag-parsers.ts";
import { watchLauncher } from "./launcher-watch.ts";
import { registerSelfImports } from "./self-imports.ts";
import { terminalSafe } from "./terminal-text.ts";
import pkg from "../../package.json" with { type: "json" };

watchLauncher();
registerSelfImports();

/** Flags shared by `rollout` and `serve`: each overrides one config value. */
function configFlags(cmd: Command): Command {
  return cmd
    .option("--config <file>", "YAML/JSON config file (verl-style rollout section plus engine, tools, store, reward)")
    .option("--n <n>", "rollout.n: sessions per prompt", intFlag("--n", 1))
    .option("--engine <sim|url>", "engine.url: 'sim' (embedded simulated engine) or an engine/gateway URL")
    .addOption(new Option("--engine-format <format>", "engine.format: vllm (/v1/completions), vllm-generate (/inference/v1/generate), sglang (/generate)").choices(["vllm", "vllm-generate", "sglang"]))
    .option("--engine-api-key <key>", "engine.api_key: the engine's --api-key, sent as Authorization: Bearer (prefer env EDGELOOP_ENGINE_API_KEY: a flag shows in ps)")
    .option("--engine-admin-api-key <key>", "engine.admin_api_key: SGLang's --admin-api-key for pause/resume (prefer env EDGELOOP_ENGINE_ADMIN_API_KEY)")
    .option("--script <file>", "engine.script: scripted policy for the simulated engine")
    .option("--replicas <k>", "engine.replicas: simulated replicas behind the embedded gateway", intFlag("--replicas", 1, 64))
    .option("--tools <file>", "tools.file: tools file (default: the example tool server, started in-process)")
    .option("--tools-secret <secret>", "tools.secret: HMAC secret for tool webhooks (prefer env EDGELOOP_TOOLS_SECRET or EDGELOOP_TOOLS_SECRET_FILE: a flag shows in ps)")
    .option("--store <store>", "store.url: memory | redis://host:port | redis+cluster://host:port,host:port (Redis/Valkey Cluster) | upstash")
    .option("--store-prefix <prefix>", "store.prefix: prefix of every Redis key (default edgeloop:)")
    .option("--store-shards <n>", "store.shards: stream shards per partition (default 1; every writer and reader of a prefix must agree)", intFlag("--store-shards", 1, 1024))
    .addOption(new Option("--store-durability <mode>", "store.durability: primary (default: a write is done once the primary answered) or replicated (each write waits for store.wait_replicas replica acknowledgements, WAIT; Redis over TCP)").choices(["primary", "replicated"]))
    .option("--blob-store <url>", "store.blobs.url: file:///dir or s3://bucket/prefix (AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID…): routed experts above --blob-threshold go there, the record holds a pointer + sha256")
    .option("--blob-threshold <bytes>", "store.blobs.threshold_bytes: packed bytes from which routed experts go to the blob store (default 1048576)", intFlag("--blob-threshold", 0))
    .option("--store-timeout <seconds>", "exit non-zero when the store stays unreachable this long (default: reconnect for as long as it is down)", secondsFlag("--store-timeout"))
    .option("--prompt-length <n>", "rollout.prompt_length", intFlag("--prompt-length", 1))
    .option("--response-length <n>", "rollout.response_length", intFlag("--response-length", 1))
    .option("--max-model-len <n>", "rollout.max_model_len", intFlag("--max-model-len", 2))
    .option("--max-assistant-turns <n>", "rollout.multi_turn.max_assistant_turns", intFlag("--max-assistant-turns", 1))
    .option("--trajectory-deadline <seconds>", "rollout.trajectory_deadline_s: wall-clock seconds a trajectory may run from its first start, then it ends with what it sampled (terminated_by deadline; default 3600; the config's null: none)", intFlag("--trajectory-deadline", 1, MAX_TIMER_SECONDS))
    .option("--default-agent <name>", "rollout.agent.default_agent_loop")
    .option("--seed <n>", "rollout.seed (and the simulated engine's seed)", intFlag("--seed", Number.MIN_SAFE_INTEGER))
    .option("--concurrency <n>", "trajectories run at once", intFlag("--concurrency", 1, 100_000))
    .option("--model <name|dir>", "model: qwen3 (default), qwen3_vl (images), llama3_1, deepseek_v3, gpt_oss, gemma3, or a Hugging Face model directory (tokenizer.json, tokenizer_config.json, optional chat_template.jinja and generation_config.json)")
    .option("--agent <url|example>", "agent.url: where openai_agent tasks are POSTed (openai_agent becomes the default loop); rollout only: every row runs through openai_agent, and `example` starts the example agent (edgeloop agent-example) in-process")
    .option("--agent-timeout-ms <ms>", "agent.timeout_ms: how long an openai_agent trajectory's agent has, from its task to the session's deadline (default 600000)", msFlag("--agent-timeout-ms", 1))
    .option("--agent-secret <secret>", "agent.secret: HMAC secret the agent tasks are signed with (x-edgeloop-signature; prefer env EDGELOOP_AGENT_SECRET or EDGELOOP_AGENT_SECRET_FILE)")
    .option("--public-url <url>", "agent.public_url: the URL agents reach this edgeloop API at (the tasks' base_url)");
}

let telemetry: Telemetry | null = null;
const program = new Command("edgeloop")
  .description("The agent loop of agentic RL as edge-style functions: prompts in, token-exact trajectories out.")
  .version(pkg.version, "-V, --version", "print edgeloop's version (package.json) and exit")
  // Flag and argument errors end the run with one line and exit code 2 (main's catch), not
  // commander's own message, help text and exit code 1. Subcommands inherit both settings.
  .exitOverride()
  .configureOutput({ outputError: () => {} })
  .hook("preAction", () => {
    telemetry ??= setupTelemetryFromEnv();
  })
  .hook("postAction", async () => {
    await telemetry?.shutdown();
  });

configFlags(
  program
    .command("rollout")
    .description("run a batch of dataset rows and write every trajectory record")
    .requiredOption("--data <file>", "dataset rows: .jsonl, .json or verl-style .parquet")
    .option("--out <file>", "write every TrajectoryRecord to this JSONL file")
    .option("--validate", "validation batch: rollout.val_kwargs sampling, val partition")
    .option("--global-steps <n>", "global_steps recorded in trajectory_info", intFlag("--global-steps", -1))
    .option("--model-version <v>", "policy version recorded for every turn (until one is posted to /v1/model-version)", versionFlag("--model-version"))
    .option("--no-progress", "plain lines instead of a progress bar")
    .option("--stall-warn <seconds>", "warn when no session has finished for this long (default 60; 0: never)", secondsFlag("--stall-warn", { allowZero: true }))
    .addOption(new Option("--jobs <mode>", "inline (default): run the batch here; queue: enqueue it for `edgeloop worker`s (Redis/Upstash store) and wait for them").choices(["inline", "queue"])),
).action(async (opts) => (await import("./rollout-command.ts")).rolloutCommand(opts));

configFlags(
  program
    .command("serve")
    .description("serve the HTTP API (rollouts, groups, openapi) on one port")
    .option("--port <port>", "port", port, 8787)
    .option("--host <host>", "address to bind (a non-loopback address needs EDGELOOP_API_TOKEN, or --insecure-no-auth)", "127.0.0.1")
    .option("--metrics-auth", "GET /metrics needs the API token too (default: public, like /health)")
    .option("--insecure-no-auth", "serve without EDGELOOP_API_TOKEN on a non-loopback --host (anyone who reaches it can use the API)")
    .option("--drain-timeout <seconds>", "after SIGINT/SIGTERM, seconds the work running here (inline batches, agent sessions) gets to end before serve exits 1 anyway (default 30; a second signal exits at once)", secondsFlag("--drain-timeout"))
    .option("--reuse-port", "bind with SO_REUSEPORT (Linux) so a second serve on the same store can listen on the same port: kill or restart one, the other answers (queue mode)")
    .addOption(
      new Option("--jobs <mode>", "queue: POST /v1/rollouts enqueues jobs for `edgeloop worker` (default with a Redis/Upstash store); inline: run batches in this process").choices([
        "inline",
        "queue",
      ]),
    )
    .option("--max-pending <n>", "queue mode: answer 503 + Retry-After when more jobs than this would be waiting", intFlag("--max-pending", 1))
    .option("--lost-grace <seconds>", "queue mode: seconds an unfinished trajectory may be missing from the store (no job, session or record) before it is reported lost (default 30)", secondsFlag("--lost-grace")),
).action(async (opts) => (await import("./serve-command.ts")).serveCommand(opts));

configFlags(
  program
    .command("worker")
    .description("claim trajectory jobs from the store's Redis (enqueued by `serve` in queue mode), run them, exit when idle")
    .option("--idle-exit <seconds>", "exit after this many seconds without a job (scale to zero; 0: as soon as none is waiting); never while another worker's jobs are in the stream (it stays to reclaim them if that worker dies)", secondsFlag("--idle-exit", { allowZero: true }))
    .option("--lease <seconds>", "seconds without a heartbeat before another worker reclaims a job (default 30)", secondsFlag("--lease", { min: { seconds: 0.1, why: "jobs are heart-beaten every third of it, at least 50 ms apart: a shorter lease hands running jobs to other workers" } }))
    .option("--consumer <name>", "consumer name in the workers group (default <host>-<pid>-<random>)")
    .option("--max-running-total <n>", "sessions running at once across all workers of the store prefix (a store-wide cap; give every worker the same value); default: only --concurrency per worker", intFlag("--max-running-total", 1))
    .option("--drain-timeout <seconds>", "after SIGINT/SIGTERM, seconds the running jobs get to finish before the worker exits and leaves them to be reclaimed (default: wait for them)", secondsFlag("--drain-timeout"))
    .option("--metrics-port <port>", "serve GET /metrics (Prometheus: this worker's engine and tool calls, its job counts) on this port; 0: a free one, printed", intFlag("--metrics-port", 0, 65535))
    .option("--metrics-host <host>", "address the --metrics-port listener binds (default 127.0.0.1; 0.0.0.0 to be scraped from outside the pod)"),
)
  .action(async (opts) => (await import("./worker-command.ts")).workerCommand(opts));
// Jobs carry their batch's rollout section: these flags are refused on a worker (worker-command.ts), so not listed.
for (const o of program.commands.find((c) => c.name() === "worker")!.options) {
  if (["--n", "--prompt-length", "--response-length", "--max-assistant-turns", "--trajectory-deadline", "--default-agent"].includes(o.long ?? "")) o.hideHelp();
}

program
  .command("cancel")
  .description("cancel a batch over HTTP (DELETE /v1/rollouts/{batch}; EDGELOOP_API_TOKEN as the bearer token) and print its final stats")
  .argument("<batch>", "batch id, as POST /v1/rollouts answered")
  .option("--url <url>", "the edgeloop API (edgeloop serve)", "http://127.0.0.1:8787")
  .action(async (batch: string, opts) => (await import("./cancel-command.ts")).cancelCommand(batch, opts));

program
  .command("gc")
  .description("delete what the store no longer needs: acknowledged groups and their records, finished sessions, finished batches' metadata, older than store.retention (SCAN by prefix; never an incomplete group, a running session or batch)")
  .option("--config <file>", "config file: its store section (url, prefix, retention)")
  .option("--store <store>", "store.url: redis://host:port | upstash")
  .option("--store-prefix <prefix>", "store.prefix: prefix of every Redis key (default edgeloop:)")
  .option("--blob-store <url>", "store.blobs.url: the blob store records' routed experts went to (file:///dir | s3://bucket/prefix): a removed record's blobs go with it")
  .option("--older-than <duration>", "one age for records, groups, sessions and batches instead of store.retention: 90s, 30m, 12h, 7d, 2w", durationFlag("--older-than"))
  .option("--dry-run", "print what would be deleted; delete nothing")
  .option("--json", "print the report as JSON")
  .action(async (opts) => (await import("./gc-command.ts")).gcCommand(opts));

program
  .command("inspect")
  .description("print one trajectory decoded, sampled tokens (mask 1) and observations (mask 0) in colour, with a one-line summary")
  .argument("<key>", "trajectory key {uid}_{session_id}_{output_index}")
  .option("--file <file>", "read the record from a JSONL file of records (what rollout --out writes)")
  .option("--store <store>", "read it from a transfer queue: redis://host:port | upstash (memory holds nothing across processes)")
  .option("--store-prefix <prefix>", "prefix of every Redis key (default edgeloop:)")
  .option("--json", "print the record as JSON instead")
  .option("--model <name|dir>", "model: qwen3 (default), qwen3_vl (images), llama3_1, deepseek_v3, gpt_oss, gemma3, or a Hugging Face model directory (tokenizer.json, tokenizer_config.json, optional chat_template.jinja and generation_config.json)")
  .option("--color", "colour even when stdout is not a terminal")
  .option("--no-color", "no colours (also: NO_COLOR=1)")
  .option("--no-prompt", "leave out the prompt")
  .action(async (key: string, opts) => (await import("./inspect-command.ts")).inspectCommand(key, opts));

program
  .command("doctor")
  .description("probe a running engine as edgeloop will call it (reachability, API key, max_model_len, token ids, log-probs, tokenizer, stop ids, cached tokens; pause/resume with --admin): one line per check, exit 0 when none fails")
  .option("--config <file>", "config file: its engine section, model, rollout.max_model_len, rollout.return_routed_experts and rollout.teacher")
  .option("--engine <url>", "engine.url: the engine or router to probe")
  .addOption(new Option("--engine-format <format>", "engine.format: vllm (/v1/completions), vllm-generate (/inference/v1/generate), sglang (/generate)").choices(["vllm", "vllm-generate", "sglang"]))
  .option("--engine-api-key <key>", "engine.api_key: the engine's --api-key (prefer env EDGELOOP_ENGINE_API_KEY: a flag shows in ps)")
  .option("--engine-admin-api-key <key>", "engine.admin_api_key: SGLang's --admin-api-key for pause/resume (prefer env EDGELOOP_ENGINE_ADMIN_API_KEY)")
  .option("--model <name|dir>", "model: qwen3 (default), qwen3_vl (images), llama3_1, deepseek_v3, gpt_oss, gemma3, or a Hugging Face model directory: the tokenizer the engine's ids are compared with")
  .option("--max-model-len <n>", "rollout.max_model_len", intFlag("--max-model-len", 2))
  .option("--admin", "also pause (mode abort) and resume the engine once through its control API, only while no request is running there")
  .option("--force", "with --admin: pause and resume even when doctor cannot tell whether requests are running (no request counts on /metrics or /get_load)")
  .option("--timeout <seconds>", "deadline of each probe call (default 30)", secondsFlag("--timeout"))
  .action(async (opts) => (await import("./doctor-command.ts")).doctorCommand(opts));

program
  .command("sim-engine")
  .description("serve the simulated inference engine (vLLM and SGLang wire formats)")
  .option("--port <port>", "first port (replica i listens on port+i)", port, 8000)
  .option("--replicas <k>", "replicas", intFlag("--replicas", 1, 64), 1)
  .option("--script <file>", "scripted policy file")
  .option("--host <host>", "address to bind", "127.0.0.1")
  .option("--model <name|dir>", "the model whose tokens the engine samples: qwen3 (default), qwen3_vl (images), llama3_1, deepseek_v3, gpt_oss, gemma3, or a model directory")
  .option("--moe <layers,top_k,num_experts>", "MoE shape of the routed experts SGLang's /generate returns with return_routed_experts (default 4,2,16)")
  .option("--max-model-len <n>", "context size the engine reports (/v1/models max_model_len) and enforces (default 40960)", intFlag("--max-model-len", 2))
  .option("--kv-cache-blocks <n>", "prefix KV cache per replica, in 16-token blocks (default 16384)", intFlag("--kv-cache-blocks", 1))
  .option("--prefill-ms-per-token <ms>", "latency model: milliseconds per uncached prompt token (default 0)", msPerTokenFlag("--prefill-ms-per-token"))
  .option("--decode-ms-per-token <ms>", "latency model: milliseconds per generated token (default 0)", msPerTokenFlag("--decode-ms-per-token"))
  .addOption(new Option("--engine-version <v>", "the vLLM version the vLLM endpoints play: main (newest) or 0.2x (see docs/engines.md §5)").choices(["main", "0.2x"]))
  .option("--api-key <key>", "require Authorization: Bearer <key> as vLLM/SGLang --api-key does (or env EDGELOOP_SIM_API_KEY)")
  .option("--admin-api-key <key>", "SGLang --admin-api-key: the control routes take this key only (or env EDGELOOP_SIM_ADMIN_API_KEY)")
  .option("--no-prompt-tokens-details", "play a vLLM without --enable-prompt-tokens-details (no usage.prompt_tokens_details.cached_tokens)")
  .option("--no-scale-out", "play a vLLM without --enable-scale-out (/inference/v1/generate answers 404)")
  .action(async (opts) => (await import("./engine-commands.ts")).simEngineCommand(opts));

program
  .command("gateway")
  .description("serve the sticky-routing inference gateway in front of engine replicas")
  .requiredOption("--replicas <urls>", "comma-separated replica base URLs")
  .option("--port <port>", "port", port, 8080)
  .addOption(new Option("--policy <policy>", "routing policy").choices(["least_inflight_sticky", "bounded_load_hash", "round_robin"]).default("least_inflight_sticky"))
  .option("--host <host>", "address to bind", "127.0.0.1")
  .option("--config <file>", "config file: its gateway and store sections")
  .option("--attempt-timeout-ms <ms>", "gateway.attempt_timeout_ms: deadline of one attempt at one replica (then the next replica)", msFlag("--attempt-timeout-ms", 1))
  .option("--eject-after <n>", "gateway.eject_after: consecutive failures that eject a replica (default 3)", intFlag("--eject-after", 1))
  .option("--cooldown-ms <ms>", "gateway.cooldown_ms: cool-down of an ejected replica before a half-open probe (default 10000)", msFlag("--cooldown-ms", 0))
  .option("--max-attempts <n>", "gateway.max_attempts: replicas one call may try (default 3)", intFlag("--max-attempts", 1))
  .option("--health-interval-ms <ms>", "gateway.health_interval_ms: period of the replicas' /health probes, 0 = only on demand (default 5000)", msFlag("--health-interval-ms", 0))
  .option("--epsilon <x>", "gateway.epsilon: bounded-load ε, a replica takes at most (1+ε) × the mean load (default 0.25; 0.2 with a shared state)", positiveNumberFlag("--epsilon"))
  .option("--max-sticky-keys <n>", "gateway.max_sticky_keys: sticky keys a per-process gateway remembers (default 10000)", intFlag("--max-sticky-keys", 1))
  .option("--store <store>", "store.url: redis://host:port or upstash: pins, in-flight leases and ejections shared by every gateway instance (default memory: per process)")
  .option("--store-prefix <prefix>", "store.prefix: prefix of the routing keys (default edgeloop:)")
  .option("--no-shared-state", "gateway.shared_state false: keep routing state per process even with a store")
  .action(async (opts, cmd: Command) => (await import("./engine-commands.ts")).gatewayCommand({ ...opts, policySource: cmd.getOptionValueSource("policy") }));

program
  .command("tools")
  .description("serve the example tool webhooks (calc, lookup)")
  .option("--port <port>", "port", port, 8123)
  .option("--host <host>", "address to bind", "127.0.0.1")
  .option("--secret <secret>", "HMAC secret: require x-edgeloop-signature (default: EDGELOOP_TOOLS_SECRET)")
  .action(async (opts) => (await import("../tools/main.ts")).serveTools(opts));

program
  .command("agent-example")
  .description("serve the example agent's webhook (POST /tasks): a ReAct calculator agent on the openai SDK, for the openai_agent loop")
  .option("--port <port>", "port", port, 8124)
  .option("--host <host>", "address to bind", "127.0.0.1")
  .option("--secret <secret>", "HMAC secret: require x-edgeloop-signature (default: EDGELOOP_AGENT_SECRET)")
  .option("--max-steps <n>", "most chat-completion calls per task (default 8)", intFlag("--max-steps", 1, 1000))
  .action(async (opts) => (await import("../agent-example/main.ts")).serveAgentExample(opts));

program
  .command("sandbox-provider")
  .description("serve the example sandbox provider (create/release/heartbeat, tools sbx_write and sbx_read on per-sandbox files)")
  .option("--port <port>", "port", port, 8125)
  .option("--host <host>", "address to bind", "127.0.0.1")
  .option("--secret-env <var>", "environment variable (or <var>_FILE) holding the HMAC secret: require x-edgeloop-signature (default: EDGELOOP_TOOLS_SECRET when set)")
  .option("--openenv", "each sandbox runs its own example OpenEnv environment at /envs/{sandbox_id} (create replies carry base_url; for openenv.base_url: sandbox)")
  .action(async (opts) => (await import("../sandbox/main.ts")).serveSandboxProvider(opts));

program
  .command("upstash-bridge")
  .description("serve the Upstash REST protocol over a local Redis")
  .option("--port <port>", "port", port, 8079)
  .option("--redis <url>", "Redis URL", "redis://127.0.0.1:6379")
  .option("--token <token>", "bearer token clients must send (prefer env UPSTASH_REDIS_REST_TOKEN or UPSTASH_REDIS_REST_TOKEN_FILE: a flag shows in ps)")
  .option("--host <host>", "address to bind", "127.0.0.1")
  .action(async (opts) => (await import("./engine-commands.ts")).upstashBridgeCommand(opts));

/**
 * One line for an error that escaped a command, and the exit code: 2 for
 * edgeloop's own errors (bad flag, config, unreachable store) and a port in
 * use, 1 for anything else. The stack only with `EDGELOOP_DEBUG=1`.
 */
function reportError(e: unknown): number {
  const err = e as { code?: unknown; message?: unknown; stack?: unknown };
  let code = 1;
  let line: string;
  if (e instanceof CommanderError) {
    // `--help` exits 0; help shown for a missing subcommand has already been printed.
    if (e.exitCode === 0) return 0;
    if (e.message === "(outputHelp)") return 2;
    console.error(`edgeloop: ${commanderLine(e)}`);
    return 2;
  }
  if (err?.code === "EADDRINUSE") {
    const p = /port (\d+)/i.exec(String(err.message))?.[1];
    line = `port ${p ?? "(unknown)"} is already in use (another process listens on it; pick another with --port)`;
    code = 2;
  } else if (e instanceof EdgeloopError) {
    line = e.message;
    code = 2;
  } else {
    line = e instanceof Error ? (e.name && e.name !== "Error" ? `${e.name}: ${e.message}` : e.message) : String(e);
  }
  // Errors may quote model, tool or engine text: no raw control sequences on the terminal.
  console.error(`edgeloop: ${terminalSafe(line)}`);
  if (process.env.EDGELOOP_DEBUG === "1" && typeof err?.stack === "string") console.error(err.stack);
  return code;
}

/**
 * One line for a commander parse error: its message without the `error: `
 * prefix; for an invalid flag value, the parser's own message (which names
 * the flag) rather than commander's wrapper; then where to look for help.
 */
function commanderLine(e: CommanderError): string {
  const msg = e.message.replace(/^error: /, "");
  const m = /^option '(-[^' ,]*)[^']*' argument '([^']*)' is invalid\. (.+)$/s.exec(msg);
  const inner = m && (m[3]!.startsWith(m[1]!) ? m[3]! : `${m[1]} '${m[2]}': ${m[3]}`);
  const cmd = process.argv.slice(2).find((a) => program.commands.some((c) => c.name() === a));
  return `${(inner || msg).split("\n")[0]} (see edgeloop ${cmd ? `${cmd} ` : ""}--help)`;
}

const fatal = (e: unknown) => {
  const code = reportError(e);
  void Promise.resolve(telemetry?.shutdown()).finally(() => process.exit(code));
};
process.on("uncaughtException", fatal);
process.on("unhandledRejection", fatal);

try {
  await program.parseAsync(process.argv);
  // An interrupted rollout leaves trajectories in flight; they must not keep the process alive.
  if (process.exitCode === 130) process.exit(130);
} catch (e) {
  const code = reportError(e);
  await (telemetry as Telemetry | null)?.shutdown().catch(() => {});
  // Connections and servers a failed command opened must not keep the process alive.
  process.exit(code);
}
