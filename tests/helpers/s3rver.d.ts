/** The slice of `s3rver` (a fake S3 server, no bundled types) the tests use. */
declare module "s3rver" {
  export default class S3rver {
    constructor(opts: { port?: number; address?: string; silent?: boolean; directory: string; configureBuckets?: { name: string }[] });
    run(): Promise<unknown>;
    close(): Promise<void>;
  }
}
