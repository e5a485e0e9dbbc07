import { mkdir, open, readdir, readFile, rename, rm, stat } from "node:fs/promises";
import { dirname, join, resolve, sep } from "node:path";
import { ConfigError, StoreError } from "../../shared/errors.ts";
import { BlobKey } from "../../shared/schema/index.ts";
import type { BlobStore } from "../../shared/store/blob-store.ts";

/**
 * A {@link BlobStore} in one directory of the local filesystem (`--blob-store
 * file:///path`): blob `a/b/c` is the file `{root}/a/b/c`. For one machine
 * (or a shared POSIX mount: NFS, a k8s volume) — the Python reader opens the
 * same files. A put writes `{file}.tmp-{nonce}`, fsyncs it, renames it into
 * place and fsyncs the directory, so once it resolves the blob survives a
 * crash and a reader never sees a half-written file.
 * @throws ConfigError at construction when `root` is not an absolute path
 */
export class FsBlobStore implements BlobStore {
  readonly location: string;
  private readonly root: string;

  constructor(root: string) {
    if (!root.startsWith("/")) throw new ConfigError("store.blobs.url", `file:// blob store needs an absolute directory, got '${root}'`);
    this.root = resolve(root);
    this.location = `file://${this.root}`;
  }

  async put(key: string, bytes: Uint8Array): Promise<void> {
    const path = this.path(key);
    const tmp = `${path}.tmp-${Math.random().toString(36).slice(2, 10)}`;
    try {
      await mkdir(dirname(path), { recursive: true });
      const fh = await open(tmp, "w");
      try {
        await fh.writeFile(bytes);
        await fh.datasync();
      } finally {
        await fh.close();
      }
      await rename(tmp, path);
      const dir = await open(dirname(path), "r");
      try {
        await dir.sync();
      } finally {
        await dir.close();
      }
    } catch (cause) {
      await rm(tmp, { force: true }).catch(() => undefined);
      throw new StoreError(`${this.location}: cannot write blob ${key}: ${(cause as Error).message}`, { cause, code: "blob_store_error" });
    }
  }

  async get(key: string): Promise<Uint8Array | null> {
    try {
      return new Uint8Array(await readFile(this.path(key)));
    } catch (cause) {
      if ((cause as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw new StoreError(`${this.location}: cannot read blob ${key}: ${(cause as Error).message}`, { cause, code: "blob_store_error" });
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    // A directory prefix (`…/`) removes its tree; any other prefix, the files of its directory whose names start with it.
    const dir = prefix.endsWith("/") ? this.path(prefix.slice(0, -1)) : dirname(this.path(prefix));
    const start = prefix.endsWith("/") ? "" : prefix.slice(prefix.lastIndexOf("/") + 1);
    let n = 0;
    try {
      if (prefix.endsWith("/")) {
        n = await countFiles(dir);
        await rm(dir, { recursive: true, force: true });
        return n;
      }
      for (const e of await readdir(dir, { withFileTypes: true })) {
        if (!e.name.startsWith(start)) continue;
        n += e.isDirectory() ? await countFiles(join(dir, e.name)) : 1;
        await rm(join(dir, e.name), { recursive: true, force: true });
      }
      return n;
    } catch (cause) {
      if ((cause as NodeJS.ErrnoException).code === "ENOENT") return n;
      throw new StoreError(`${this.location}: cannot delete blobs under ${prefix}: ${(cause as Error).message}`, { cause, code: "blob_store_error" });
    }
  }

  /** The file of `key`, refusing a key that is not a {@link BlobKey} (so no key reaches outside the root). */
  private path(key: string): string {
    if (!BlobKey.safeParse(key).success) throw new StoreError(`blob key '${key.slice(0, 200)}' is not a blob key`, { retryable: false, code: "blob_store_error" });
    const p = join(this.root, key);
    if (!p.startsWith(this.root + sep)) throw new StoreError(`blob key '${key.slice(0, 200)}' leaves ${this.location}`, { retryable: false, code: "blob_store_error" });
    return p;
  }
}

async function countFiles(dir: string): Promise<number> {
  let n = 0;
  try {
    if (!(await stat(dir)).isDirectory()) return 1;
    for (const e of await readdir(dir, { withFileTypes: true })) n += e.isDirectory() ? await countFiles(join(dir, e.name)) : 1;
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code !== "ENOENT") throw cause;
  }
  return n;
}
