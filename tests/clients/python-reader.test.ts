/**
 * The Python reader package (clients/python, module `edgeloop`) run as a real client, under `npm test`:
 * - its unittests (hand-computed padding, record decoding, the reader on a hand-written layout in Redis);
 * - a batch run by the CLI into Redis over TCP, and one through the Upstash REST bridge, read back with
 *   `Reader.groups` and compared, every array byte for byte, with the CLI's JSONL (`--out`);
 * - the trainer loop against `edgeloop serve`: `submit` over HTTP, then read, pad and ack.
 * Python is `EDGELOOP_PYTHON`, else /usr/bin/python3 (Debian's, with python3-redis and python3-numpy), else
 * `python3`. Without python3/redis/numpy the tests skip, saying why — unless CI is set: then they fail.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { treeNodesOf, treeRecords } from "../helpers/tree-records.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { decodeRecord, encodedFields, validateAndEncode, type RoutedExpertsDtype } from "../../shared/store/record-codec.ts";
import { makeRecord } from "../store/contract.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const ROOT = join(import.meta.dir, "..", "..");
const BIN = join(ROOT, "bin", "edgeloop.mjs");
const PKG = join(ROOT, "clients", "python");
const DUMP = join(PKG, "tests", "dump_groups.py");
const PY = process.env.EDGELOOP_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
const PAD = 151643;

/** Why the Python tests cannot run here (null: they can). Under CI a missing python3/redis/numpy is a failure. */
function pythonMissing(): string | null {
  let why: string | null = null;
  try {
    const p = Bun.spawnSync([PY, "-c", "import redis, numpy; print(redis.__version__, numpy.__version__)"], { stdout: "pipe", stderr: "pipe" });
    if (p.exitCode !== 0) why = `${PY} cannot import redis and numpy (${p.stderr.toString().trim().split("\n").at(-1)}); install python3-redis and python3-numpy`;
  } catch (e) {
    why = `${PY} is not runnable (${(e as Error).message})`;
  }
  if (why && process.env.CI) throw new Error(`CI is set and the Python reader tests cannot run: ${why}`);
  if (why) console.warn(`skipping the Python reader tests: ${why}`);
  return why;
}

const missing = pythonMissing();
const hasRedis = missing ? false : await requireRedis();

interface PyRecord extends Record<string, unknown> {
  _bytes: Record<string, string>;
}
interface Dump {
  submitted: { batch_id: string; keys: string[] } | null;
  groups: { uid: string; delivery_id: string; n: number; failed: number; partition: string; records: PyRecord[]; resolved?: PyRecord[] }[];
  padded?: Record<string, unknown>;
  padded_dtypes?: Record<string, string>;
  acked: number;
  after_ack: number;
}

const hex = (a: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("hex");

/** The bytes the layout stores for a JSONL record's arrays, as dump_groups.py prints them: `<dtype>:<hex>`. */
function expectedBytes(r: TrajectoryRecord): Record<string, string> {
  const out: Record<string, string> = {
    prompt_ids: `<i4:${hex(Int32Array.from(r.prompt_ids))}`,
    response_ids: `<i4:${hex(Int32Array.from(r.response_ids))}`,
    response_mask: `|u1:${hex(Uint8Array.from(r.response_mask))}`,
  };
  if (r.rollout_log_probs) out.rollout_log_probs = `<f4:${hex(Float32Array.from(r.rollout_log_probs))}`;
  if (r.teacher_log_probs) out.teacher_log_probs = `<f4:${hex(Float32Array.from(r.teacher_log_probs))}`;
  return out;
}

async function run(cmd: string[], opts: { env?: Record<string, string>; cwd?: string } = {}) {
  const p = Bun.spawn(cmd, { cwd: opts.cwd ?? ROOT, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", ...opts.env } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

async function dump(prefix: string, extra: string[] = []): Promise<Dump> {
  const r = await run([PY, DUMP, "--url", REDIS_URL, "--prefix", prefix, "--pad-first", String(PAD), ...extra]);
  if (r.code !== 0) throw new Error(`dump_groups.py exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as Dump;
}

/** Every record the reader returned equals the JSONL's (values and stored bytes); groups are complete and in session order. */
function compareWithJsonl(d: Dump, lines: string[]) {
  const jsonl = lines.map((l) => JSON.parse(l) as TrajectoryRecord);
  const byKey = new Map(jsonl.map((r) => [r.key, r]));
  const read = d.groups.flatMap((g) => g.records);
  expect(read.map((r) => r.key).sort()).toEqual(jsonl.map((r) => r.key).sort());
  for (const g of d.groups) {
    const mine = jsonl.filter((r) => r.uid === g.uid).sort((a, b) => a.session_id - b.session_id || a.output_index - b.output_index);
    expect(g.records.map((r) => r.key)).toEqual(mine.map((r) => r.key));
    expect([g.n, g.failed, g.partition]).toEqual([mine.length, 0, "train"]);
  }
  for (const r of read) {
    const { _bytes, teacher_log_probs, routed_experts, ...rest } = r;
    const want = byKey.get(r.key as string)!;
    const { teacher_log_probs: wantTeacher, ...wantRest } = want;
    expect(rest).toEqual(wantRest as unknown as Record<string, unknown>);
    expect([teacher_log_probs, routed_experts]).toEqual([wantTeacher ?? null, null]);
    expect(_bytes).toEqual(expectedBytes(want));
  }
  // Tool trajectories: observation tokens (mask 0) and log-probs are really there.
  expect(jsonl.some((r) => r.response_mask.includes(0))).toBe(true);
  expect(jsonl.every((r) => r.rollout_log_probs !== null)).toBe(true);
  expect([d.acked, d.after_ack]).toEqual([d.groups.length, 0]);
}

/** The first group padded by hand from the JSONL, as verl's agent loop would; equals what to_padded returned. */
function comparePadded(d: Dump, lines: string[]) {
  const byKey = new Map(lines.map((l) => [(JSON.parse(l) as TrajectoryRecord).key, JSON.parse(l) as TrajectoryRecord]));
  const recs = d.groups[0]!.records.map((r) => byKey.get(r.key as string)!);
  const P = Math.max(...recs.map((r) => r.prompt_ids.length));
  const R = Math.max(...recs.map((r) => r.response_ids.length));
  const rows = recs.map((r) => {
    const lp = P - r.prompt_ids.length;
    const rp = R - r.response_ids.length;
    const attn = [...Array(lp).fill(0), ...Array(r.prompt_ids.length + r.response_ids.length).fill(1), ...Array(rp).fill(0)];
    let c = 0;
    return {
      input_ids: [...Array(lp).fill(PAD), ...r.prompt_ids, ...r.response_ids, ...Array(rp).fill(PAD)],
      attention_mask: attn,
      position_ids: attn.map((m) => Math.max((c += m) - 1, 0)),
      response_mask: [...r.response_mask, ...Array(rp).fill(0)],
      rollout_log_probs: [...r.rollout_log_probs!.map((x) => Math.fround(x)), ...Array(rp).fill(0)],
      rewards: Math.fround(r.reward_score!),
      teacher_log_probs: r.teacher_log_probs ? [...r.teacher_log_probs, ...Array(rp).fill(0)] : null,
    };
  });
  const p = d.padded!;
  for (const k of ["input_ids", "attention_mask", "position_ids", "response_mask", "rollout_log_probs", "rewards"] as const) {
    expect(p[k]).toEqual(rows.map((x) => x[k]));
  }
  expect(p.teacher_log_probs).toEqual((rows.every((x) => x.teacher_log_probs) ? rows.map((x) => x.teacher_log_probs) : null) as unknown[]);
  expect(p.routed_experts).toBeNull();
  // Each row carries its group's size (expected sessions, rows kept); the CLI's batch has no failed record.
  const g = d.groups[0]!;
  expect([p.group_n, p.group_kept, p.dropped, p.dropped_keys]).toEqual([recs.map(() => g.n), recs.map(() => recs.length), 0, []]);
  expect(g.failed).toBe(0);
  expect(d.padded_dtypes).toMatchObject({ group_n: "<i8", group_kept: "<i8", input_ids: "<i8", attention_mask: "<i8", position_ids: "<i8", response_mask: "<i8", rollout_log_probs: "<f4", rewards: "<f4" });
}

describe.skipIf(missing !== null)("the Python reader package", () => {
  let dir: string;
  const prefixes: string[] = [];
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "edgeloop-pyreader-"));
    writeFileSync(join(dir, "rows.jsonl"), readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n").slice(0, 6).join("\n") + "\n");
  });
  afterAll(async () => {
    rmSync(dir, { recursive: true, force: true });
    for (const p of prefixes) await deleteByPrefix(p);
  });

  test("its unittests pass: hand-computed padding, record decoding, the reader on a hand-written layout", async () => {
    const r = await run([PY, "-m", "unittest", "discover", "-s", join(PKG, "tests"), "-v"], { env: { REDIS_URL } });
    expect(r.stderr).toMatch(/\nOK\n?$/);
    expect(r.code).toBe(0);
    for (const name of [
      "test_hand_computed_batch (test_padding.PaddingTest",
      "test_arrays_dtypes_and_float32_bits (test_decode.DecodeTest",
      "test_teacher_log_probs_and_routed_experts (test_decode.DecodeTest",
      "test_routed_experts_packed_widths (test_decode.DecodeTest",
      "test_groups_ack_and_padding (test_reader_redis.ReaderRedisTest",
      "test_a_lost_consumer_group_is_created_again_and_redelivers (test_reader_redis.ReaderRedisTest",
    ]) {
      const line = r.stderr.split("\n").find((l) => l.startsWith(name));
      expect(hasRedis || !name.includes("Redis") ? line?.endsWith("... ok") : true).toBe(true);
    }
  }, HANG_MS);

  test("the README's install recipe (venv with the system site-packages, no build isolation) works with no package index reachable", async () => {
    // The recipe exactly as clients/python/README.md and the main README give it: the commands of their sh blocks
    // that create the venv and install into it (the apt-get line is the prerequisite .ci/run installs).
    const recipe = (file: string) =>
      [...readFileSync(join(ROOT, file), "utf8").matchAll(/```sh\n([\s\S]*?)```/g)]
        .flatMap((m) => m[1]!.split("\n"))
        .filter((l) => /^(python3 -m venv|\.venv\/bin\/pip) /.test(l))
        .map((l) => l.replace(/\s+#.*$/, ""));
    const cmds = recipe("clients/python/README.md");
    expect(cmds).toEqual(["python3 -m venv --system-site-packages .venv", ".venv/bin/pip install --no-build-isolation ./clients/python"]);
    expect(recipe("README.md")).toEqual(cmds);
    const venv = await run([PY, "-c", "import ensurepip, venv"]);
    if (venv.code !== 0) {
      if (process.env.CI) throw new Error(`CI is set and ${PY} cannot create a venv (install python3-venv): ${venv.stderr.trim()}`);
      console.warn(`skipping the install recipe: ${PY} has no venv/ensurepip (python3-venv)`);
      return;
    }
    // A fresh directory holding clients/python as a clone has it; pip sees no config file, no local wheels and
    // an index that refuses connections, so anything the recipe fetched would fail it.
    const home = mkdtempSync(join(tmpdir(), "edgeloop-pip-"));
    try {
      cpSync(PKG, join(home, "clients", "python"), { recursive: true, filter: (f) => !f.includes("__pycache__") && !f.endsWith(".egg-info") && !f.endsWith("/build") });
      const offline: Record<string, string> = { PIP_CONFIG_FILE: "/dev/null", PIP_FIND_LINKS: "", PIP_INDEX_URL: "http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL: "", PIP_DEFAULT_TIMEOUT: "5", PIP_RETRIES: "0", PIP_DISABLE_PIP_VERSION_CHECK: "1" };
      const sh = (line: string) => run(["sh", "-c", line.replace(/^python3 /, `${PY} `)], { cwd: home, env: offline });
      const made = await sh(cmds[0]!);
      expect(made.stderr).toBe("");
      expect(made.code).toBe(0);
      const inst = await sh(cmds[1]!);
      expect(inst.code, inst.stderr).toBe(0);
      expect(inst.stdout).toContain("Successfully installed edgeloop-0.1.0");
      // Installed into the venv (not found through the working directory), with Debian's redis and numpy.
      const probe = "import edgeloop, inspect, redis, numpy, sys; print(edgeloop.__version__, edgeloop.__file__.startswith(sys.prefix)); print(inspect.signature(edgeloop.Reader.groups))";
      const r = await run([join(home, ".venv", "bin", "python"), "-c", probe], { cwd: tmpdir() });
      expect(r.stderr).toBe("");
      expect(r.stdout).toBe("0.1.0 True\n(self, max=16, consumer='trainer-0', partition='train', block_ms=1000, agent_role=None, deliver='leaves')\n");
      // The control: the same offline environment refuses the plain `pip install` of an isolated venv (it must fetch
      // setuptools for the build), so the recipe passed because it needs no index, not because one answered.
      expect((await sh("python3 -m venv plain && plain/bin/pip install ./clients/python")).code).not.toBe(0);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }, HANG_MS);

  test.skipIf(!hasRedis)("a trajectory tree read with deliver='tree' gives the TypeScript reader's exact tree nodes, and resolve_tree the whole records", async () => {
    const prefix = randomPrefix("pyreader-tree");
    prefixes.push(prefix);
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    try {
      await q.expectGroup("pytree", 1);
      const recs = treeRecords("pytree");
      for (let i = 0; i < recs.length; i++) await q.put(recs[i]!, { last: i === recs.length - 1 });
    } finally {
      await q.close();
    }
    const d = await dump(prefix, ["--expect", "1", "--deliver", "tree"]);
    expect(d.groups.length).toBe(1);
    // The arrays (routed experts flattened from [tokens, layers, top_k]) and tree_prompt_length, record by record.
    const arrays = (r: Record<string, unknown>) => ({
      key: r.key,
      prompt_ids: r.prompt_ids,
      response_ids: r.response_ids,
      response_mask: r.response_mask,
      rollout_log_probs: r.rollout_log_probs,
      routed_experts: (r.routed_experts as number[][][]).flat(2),
      parent_key: r.parent_key,
      branch_at: r.branch_at,
      tree_prompt_length: r.tree_prompt_length ?? null,
    });
    expect(d.groups[0]!.records.map(arrays)).toEqual(treeNodesOf("pytree").map((r) => arrays(r as unknown as Record<string, unknown>)));
    expect(d.groups[0]!.resolved!.map(arrays)).toEqual(treeRecords("pytree").map((r) => arrays(r as unknown as Record<string, unknown>)));
    // Tree nodes are not whole records: to_padded refuses them (resolve first); an expert row that differs in the
    // shared prefix keeps the branch whole (a node keeps no prefix rows), as the TypeScript reader does.
    const script = [
      "import sys, numpy as np",
      `sys.path.insert(0, ${JSON.stringify(join(ROOT, "clients", "python"))})`,
      "from edgeloop import to_padded",
      "from edgeloop.tree import tree_node",
      "def rec(key, e, branch_at=None, parent=None):",
      "    return {'key': key, 'uid': 'u', 'session_id': 0, 'output_index': int(key[-1]), 'error': None, 'reward_score': 1.0, 'prompt_ids': np.array([10, 11, 12], np.int32), 'response_ids': np.array([20, 21, 22, 23], np.int32), 'response_mask': np.array([1, 1, 0, 1], np.uint8), 'rollout_log_probs': np.array([-1, -2, 0, -4], np.float32), 'routed_experts': np.array(e, np.int32).reshape(7, 1, 2), 'branch_at': branch_at, 'parent_key': parent}",
      "p = rec('u_0_0', list(range(14)))",
      "same = rec('u_0_1', list(range(14)), 5, 'u_0_0')",
      "other = rec('u_0_1', list(range(9)) + [77] + list(range(10, 14)), 5, 'u_0_0')",
      "node = tree_node(p, same)",
      "print(node.get('tree_prompt_length'), tree_node(p, other) is other)",
      "try:",
      "    to_padded([p, node], pad_token_id=0)",
      "except ValueError as e:",
      "    print(e)",
    ].join("\n");
    const py = await run([PY, "-c", script]);
    expect(py.stderr).toBe("");
    expect(py.stdout.trim().split("\n")).toEqual([
      "3 True",
      "record u_0_1 is a tree node (deliver='tree': its arrays start at branch_at 5); to_padded takes whole records: pass the group's records through edgeloop.resolve_tree first, or read with deliver='leaves'",
    ]);
    expect(d.acked).toBe(1);
  }, HANG_MS);

  test.skipIf(!hasRedis)("a CLI batch written over TCP reads back equal to the JSONL, every array byte for byte", async () => {
    const prefix = randomPrefix("pyreader-tcp");
    prefixes.push(prefix);
    const cli = await run(["node", BIN, "rollout", "--data", "rows.jsonl", "--n", "3", "--out", "tcp.jsonl", "--seed", "7", "--no-progress", "--store", REDIS_URL, "--store-prefix", prefix], { cwd: dir });
    expect(cli.stderr).toContain("wrote 18 records to tcp.jsonl");
    expect(cli.code).toBe(0);
    const lines = readFileSync(join(dir, "tcp.jsonl"), "utf8").trim().split("\n");
    const d = await dump(prefix);
    expect(d.groups.length).toBe(6);
    compareWithJsonl(d, lines);
    comparePadded(d, lines);
  }, HANG_MS);

  test.skipIf(!hasRedis)("routed experts the TypeScript writer packs (uint8, uint16, int32) and an older int32 record without routed_experts_dtype: decode_record reads the values the TypeScript reader returns", async () => {
    const prefix = randomPrefix("pyreader-packed");
    prefixes.push(prefix);
    const raw = rawRedis();
    // 4 prompt + 3 response tokens × 2 layers × top-2 = 28 values; the largest id picks the width.
    const ids = (top: number) => Array.from({ length: 28 }, (_, i) => (i === 0 ? top : i === 1 ? -1 : (i * 37) % (top + 1)));
    const cases: [string, number, RoutedExpertsDtype | null, number][] = [["u8", 254, "uint8", 28], ["u16", 255, "uint16", 56], ["u16max", 65534, "uint16", 56], ["i32", 65535, "int32", 112], ["old", 65536, null, 112]];
    const want: Record<string, number[]> = {};
    try {
      for (const [tag, top, dtype, bytes] of cases) {
        const rec = makeRecord(tag, 0, { routed_experts: ids(top), routed_experts_shape: [2, 2] });
        const { encoded } = validateAndEncode(rec);
        // The older layout: int32 bytes and no dtype field, as records already in a Redis are.
        if (dtype === null) delete encoded.routed_experts_dtype;
        expect(encoded.routed_experts_dtype ?? null).toBe(dtype);
        expect(Buffer.from(encoded.routed_experts!, "base64").length).toBe(bytes);
        await raw.hset(`${prefix}traj:${rec.key}`, ...encodedFields(encoded));
        expect(decodeRecord(await raw.hgetall(`${prefix}traj:${rec.key}`)).routed_experts).toEqual(ids(top));
        want[rec.key] = ids(top);
      }
      const script = `import json, sys, redis; sys.path.insert(0, ${JSON.stringify(PKG)})
from edgeloop import decode_record
r = redis.Redis.from_url(${JSON.stringify(REDIS_URL)})
keys = ${JSON.stringify(Object.keys(want))}
print(json.dumps({k: [str(d.dtype), list(d.shape), d.ravel().tolist()] for k in keys for d in [decode_record(r.hgetall(${JSON.stringify(prefix)} + "traj:" + k))["routed_experts"]]}))`;
      const r = await run([PY, "-c", script]);
      expect(r.stderr).toBe("");
      const got = JSON.parse(r.stdout) as Record<string, [string, number[], number[]]>;
      for (const [k, v] of Object.entries(want)) expect(got[k]).toEqual(["int32", [7, 2, 2], v]);
    } finally {
      raw.disconnect();
    }
  }, HANG_MS);

  test.skipIf(!hasRedis)("a CLI batch with routed experts (2 sim replicas behind the gateway, SGLang's wire, 3 × top-2): the Python package reads every array, routed_experts included, equal to the JSONL", async () => {
    const prefix = randomPrefix("pyreader-experts");
    prefixes.push(prefix);
    writeFileSync(join(dir, "experts.yaml"), "rollout:\n  return_routed_experts: true\nengine:\n  format: sglang\n  replicas: 2\n  moe: {layers: 3, top_k: 2, num_experts: 8}\n");
    const cli = await run(["node", BIN, "rollout", "--config", "experts.yaml", "--data", "rows.jsonl", "--n", "2", "--out", "experts.jsonl", "--seed", "9", "--no-progress", "--store", REDIS_URL, "--store-prefix", prefix], { cwd: dir });
    expect(cli.stderr).toContain("wrote 12 records to experts.jsonl");
    expect(cli.code).toBe(0);
    const lines = readFileSync(join(dir, "experts.jsonl"), "utf8").trim().split("\n");
    const jsonl = lines.map((l) => JSON.parse(l) as TrajectoryRecord);
    const byKey = new Map(jsonl.map((r) => [r.key, r]));
    for (const r of jsonl) {
      expect(r.routed_experts_shape).toEqual([3, 2]);
      expect(r.routed_experts!.length).toBe((r.prompt_ids.length + r.response_ids.length) * 6);
      // The final sampled token was never forwarded: the fill value 0.
      expect(r.routed_experts!.slice(-6)).toEqual([0, 0, 0, 0, 0, 0]);
    }
    const d = await dump(prefix);
    expect(d.groups.length).toBe(6);
    const read = d.groups.flatMap((g) => g.records);
    expect(read.map((r) => r.key).sort()).toEqual(jsonl.map((r) => r.key).sort());
    for (const r of read) {
      const { _bytes, teacher_log_probs, routed_experts, ...rest } = r;
      const { routed_experts: wantExperts, routed_experts_shape: _shape, ...want } = byKey.get(r.key as string)!;
      expect(rest).toEqual(want as unknown as Record<string, unknown>);
      expect(teacher_log_probs).toBeNull();
      // [tokens][layers][top_k] in Python, flat row-major in the JSONL.
      expect((routed_experts as number[][][]).flat(2)).toEqual(wantExperts!);
      expect((routed_experts as number[][][])[0]!.length).toBe(3);
      expect(_bytes).toEqual({ ...expectedBytes(byKey.get(r.key as string)!), routed_experts: `<i4:${hex(Int32Array.from(wantExperts!))}` });
    }
    // 8 experts: stored one byte a value (uint8), decoded by Python to the int32 values above.
    const raw = rawRedis();
    const stored = await raw.hgetall(`${prefix}traj:${jsonl[0]!.key}`);
    raw.disconnect();
    expect(stored.routed_experts_dtype).toBe("uint8");
    expect(Buffer.from(stored.routed_experts!, "base64").length).toBe(jsonl[0]!.routed_experts!.length);
    // to_padded: routed_experts int32 [B, P + R, 3, 2], aligned with input_ids (left-padded prompt, right-padded response), pads 0.
    const recs = d.groups[0]!.records.map((r) => byKey.get(r.key as string)!);
    const P = Math.max(...recs.map((r) => r.prompt_ids.length));
    const R = Math.max(...recs.map((r) => r.response_ids.length));
    const padded = recs.map((r) => {
      const rows: number[][][] = [];
      for (let i = 0; i < P - r.prompt_ids.length; i++) rows.push([[0, 0], [0, 0], [0, 0]]);
      for (let t = 0; t < r.prompt_ids.length + r.response_ids.length; t++) {
        const v = r.routed_experts!.slice(t * 6, t * 6 + 6);
        rows.push([v.slice(0, 2), v.slice(2, 4), v.slice(4, 6)]);
      }
      for (let i = 0; i < R - r.response_ids.length; i++) rows.push([[0, 0], [0, 0], [0, 0]]);
      return rows;
    });
    expect(d.padded!.routed_experts).toEqual(padded);
    expect(d.padded_dtypes!.routed_experts).toBe("<i4");
  }, HANG_MS);

  test.skipIf(!hasRedis)("with a teacher (rollout.teacher): teacher_log_probs read by Python equal the JSONL's bit for bit", async () => {
    const prefix = randomPrefix("pyreader-teacher");
    prefixes.push(prefix);
    writeFileSync(join(dir, "teacher.json"), JSON.stringify({ rollout: { teacher: { url: "sim", format: "sglang" } } }));
    const cli = await run(["node", BIN, "rollout", "--config", "teacher.json", "--data", "rows.jsonl", "--n", "2", "--out", "teacher.jsonl", "--seed", "9", "--no-progress", "--store", REDIS_URL, "--store-prefix", prefix], { cwd: dir });
    expect(cli.stderr).toContain("wrote 12 records to teacher.jsonl");
    expect(cli.code).toBe(0);
    const lines = readFileSync(join(dir, "teacher.jsonl"), "utf8").trim().split("\n");
    const jsonl = lines.map((l) => JSON.parse(l) as TrajectoryRecord);
    expect(jsonl.every((r) => r.teacher_log_probs?.length === r.response_ids.length)).toBe(true);
    expect(jsonl.some((r) => r.response_mask.includes(0) && r.teacher_log_probs!.some((v, i) => r.response_mask[i] === 1 && v !== 0))).toBe(true);
    const d = await dump(prefix);
    expect(d.groups.length).toBe(6);
    compareWithJsonl(d, lines);
    for (const r of d.groups.flatMap((g) => g.records)) expect(r._bytes.teacher_log_probs).toMatch(/^<f4:[0-9a-f]+$/);
    comparePadded(d, lines);
    expect(d.padded_dtypes).toMatchObject({ teacher_log_probs: "<f4" });
  }, HANG_MS);

  test.skipIf(!hasRedis)("a CLI batch written through the Upstash REST bridge reads back the same way", async () => {
    const prefix = randomPrefix("pyreader-upstash");
    prefixes.push(prefix);
    const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: "pyreader-token" });
    try {
      const cli = await run(["node", BIN, "rollout", "--data", "rows.jsonl", "--n", "2", "--out", "upstash.jsonl", "--seed", "8", "--no-progress", "--store", "upstash", "--store-prefix", prefix], {
        cwd: dir,
        env: { UPSTASH_REDIS_REST_URL: bridge.url, UPSTASH_REDIS_REST_TOKEN: "pyreader-token" },
      });
      expect(cli.stderr).toContain("wrote 12 records to upstash.jsonl");
      expect(cli.code).toBe(0);
    } finally {
      await bridge.stop();
    }
    const lines = readFileSync(join(dir, "upstash.jsonl"), "utf8").trim().split("\n");
    const d = await dump(prefix);
    expect(d.groups.length).toBe(6);
    compareWithJsonl(d, lines);
    comparePadded(d, lines);
  }, HANG_MS);

  test.skipIf(!hasRedis)("the trainer loop against edgeloop serve: submit over HTTP (bearer token), read, pad, ack", async () => {
    const prefix = randomPrefix("pyreader-serve");
    prefixes.push(prefix);
    const serve = Bun.spawn(["node", BIN, "serve", "--port", "0", "--jobs", "inline", "--engine", "sim", "--seed", "7", "--store", REDIS_URL, "--store-prefix", prefix], {
      cwd: dir,
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, NO_COLOR: "1", EDGELOOP_API_TOKEN: "sekrit" },
    });
    try {
      let out = "";
      const reader = serve.stdout.getReader();
      const dec = new TextDecoder();
      const deadline = Date.now() + 30_000;
      while (!/serving on (http:\/\/\S+)/.test(out) && Date.now() < deadline) {
        const { value, done } = await reader.read();
        if (done) break;
        out += dec.decode(value);
      }
      reader.releaseLock();
      const api = /serving on (http:\/\/\S+)/.exec(out)?.[1];
      expect(api).toBeDefined();
      const d = await dump(prefix, ["--submit", api!, "--rows", join(dir, "rows.jsonl"), "--token", "sekrit", "--expect", "6"]);
      expect(d.submitted!.keys.length).toBe(12);
      expect(d.groups.length).toBe(6);
      const read = d.groups.flatMap((g) => g.records);
      expect(read.map((r) => r.key).sort()).toEqual([...d.submitted!.keys].sort());
      // Each record equals what the API serves for its key.
      for (const r of read.slice(0, 4)) {
        const res = await fetch(`${api}/v1/trajectories/${r.key}`, { headers: { authorization: "Bearer sekrit" } });
        const { _bytes, teacher_log_probs: _t, routed_experts: _e, ...rest } = r;
        expect(rest).toEqual(await res.json());
      }
      expect([d.acked, d.after_ack]).toEqual([6, 0]);
      // Errors come back as EdgeloopHTTPError with the API's code and field.
      const tryTokens = (env: string) =>
        run([PY, "-c", [
          "import sys; sys.path.insert(0, sys.argv[1])",
          "from edgeloop import submit, EdgeloopHTTPError",
          "for tok in (None, 'sekrit', 'wrong'):",
          "    try: submit(sys.argv[2], [{'prompt': []}], config={'rollout': {'n': 0}}, token=tok)",
          "    except EdgeloopHTTPError as e: print(e.status, e.code, e.field)",
        ].join("\n"), PKG, api!], { env: { EDGELOOP_API_TOKEN: env } });
      const errs = await tryTokens("");
      expect(errs.stderr).toBe("");
      expect(errs.stdout.trim().split("\n")).toEqual(["401 unauthorized None", "400 invalid_config rollout.n", "401 unauthorized None"]);
      // Without token=, submit sends EDGELOOP_API_TOKEN (past auth: the body's own 400); token= wins over it.
      const fromEnv = await tryTokens("sekrit");
      expect(fromEnv.stderr).toBe("");
      expect(fromEnv.stdout.trim().split("\n")).toEqual(["400 invalid_config rollout.n", "400 invalid_config rollout.n", "401 unauthorized None"]);
    } finally {
      serve.kill();
      await serve.exited;
    }
  }, HANG_MS);
});
