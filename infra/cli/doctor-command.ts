import { redactUrl } from "../../shared/http/outbound.ts";
import { checkConfigFile, parseLayeredConfig, type AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";
import type { TeacherClient } from "../../shared/inference/teacher-client.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { DOCTOR_CHECKS, doctorFailed, formatDoctorLine, runDoctor } from "./doctor-checks.ts";
import { readConfigFile, resolveConfigPaths } from "./files.ts";
import { flagConfigError, overridesFromFlags, type ConfigFlags } from "./flags.ts";
import { routedExpertsEngineShape } from "./routed-experts-config.ts";

/** Flags of `edgeloop doctor` (the engine's config flags of `rollout`/`serve`, plus its own). */
export interface DoctorFlags extends Pick<ConfigFlags, "config" | "engine" | "engineFormat" | "engineApiKey" | "engineAdminApiKey" | "model" | "maxModelLen"> {
  /** Also pause and resume the engine once (only while no request runs there). */
  admin?: boolean;
  /** With `--admin`: pause even when doctor cannot tell whether requests are running. */
  force?: boolean;
  /** Deadline of each probe call, seconds (default {@link DOCTOR_TIMEOUT_S}, at most `engine.timeout_ms`). */
  timeout?: number;
}

/** Default deadline of one probe call, in seconds. */
export const DOCTOR_TIMEOUT_S = 30;

/**
 * `edgeloop doctor --engine URL [--engine-format F] [--model M] [--admin [--force]]`:
 * probes a running engine as edgeloop will call it (see `runDoctor`) and
 * prints a header, one line per check and a summary on stdout. Exit code 0
 * when no check fails (`missing`/`mismatch`), 1 otherwise (set on
 * `process.exitCode`). Keys are never printed.
 * @throws InputError / ConfigError (exit 2): a bad flag or config, `engine.url` left at `sim`,
 *   `--force` without `--admin`, `rollout.return_routed_experts` the engine's format cannot serve
 */
export async function doctorCommand(o: DoctorFlags): Promise<void> {
  if (o.force && !o.admin) throw new InputError("--force", "applies with --admin only (it lets the pause/resume check run when doctor cannot tell whether requests are running)");
  const fileCfg = o.config ? resolveConfigPaths(await readConfigFile(o.config), o.config) : {};
  if (o.config) checkConfigFile(fileCfg, o.config);
  let config: AppConfig;
  try {
    config = parseLayeredConfig(fileCfg, overridesFromFlags(o), o.config ?? "flags");
  } catch (e) {
    throw flagConfigError(e, o);
  }
  if (config.engine.url === "sim") {
    const why = "doctor probes a running engine: pass its URL (e.g. http://127.0.0.1:8000); to try doctor on the simulator, start one with `edgeloop sim-engine --port 8000`";
    throw o.engine !== undefined ? new InputError("--engine", why) : new ConfigError("engine.url", `${why} (set --engine or engine.url)`);
  }
  routedExpertsEngineShape(config);
  const tokenizer = await loadTokenizer(config.model ?? undefined);
  let teacher: TeacherClient | undefined;
  if (config.rollout.teacher) {
    const { teacherClientsFor } = await import("./teacher.ts");
    teacher = teacherClientsFor(config, tokenizer)(config.rollout.teacher);
  }
  const e = config.engine;
  const keys = `${e.api_key ? ", API key set" : ""}${e.admin_api_key ? ", admin key set" : ""}`;
  console.log(`edgeloop doctor: ${redactUrl(e.url)} (engine.format ${e.format}, model ${tokenizer.name}${keys}${o.admin ? ", --admin" : ""})`);
  const lines = await runDoctor({ config, tokenizer, admin: o.admin === true, force: o.force === true, timeoutMs: Math.min(e.timeout_ms, (o.timeout ?? DOCTOR_TIMEOUT_S) * 1000), ...(teacher ? { teacher } : {}) });
  for (const l of lines) console.log(formatDoctorLine(l));
  const failed = lines.filter((l) => l.status === "missing" || l.status === "mismatch").map((l) => l.check);
  const count = (s: string) => lines.filter((l) => l.status === s).length;
  const tally = `${count("ok")} ok${count("warn") ? `, ${count("warn")} warn` : ""}, ${count("skipped")} skipped`;
  console.log(doctorFailed(lines) ? `edgeloop doctor: ${failed.length} of ${DOCTOR_CHECKS.length} failed (${failed.join(", ")}); ${tally}` : `edgeloop doctor: ready (${tally})`);
  process.exitCode = doctorFailed(lines) ? 1 : 0;
}
