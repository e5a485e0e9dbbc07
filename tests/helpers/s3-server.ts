import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import S3rver from "s3rver";

/** An S3-protocol server on a free loopback port (the `s3rver` package, files in a temp directory), with one bucket. */
export interface S3Server {
  endpoint: string;
  port: number;
  bucket: string;
  /** The credentials s3rver checks SigV4 signatures against. */
  credentials: { accessKeyId: string; secretAccessKey: string };
  stop(): Promise<void>;
}

/** Starts {@link S3Server}; resolves once it listens. */
export async function startS3Server(bucket = "edgeloop-test"): Promise<S3Server> {
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-s3rver-"));
  const server = new S3rver({ port: 0, address: "127.0.0.1", silent: true, directory: dir, configureBuckets: [{ name: bucket }] });
  const info = (await server.run()) as { port: number };
  return {
    endpoint: `http://127.0.0.1:${info.port}`,
    port: info.port,
    bucket,
    credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" },
    async stop() {
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
