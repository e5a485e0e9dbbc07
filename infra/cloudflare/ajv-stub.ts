/**
 * Stands in for `ajv` and `ajv-formats` in the Worker bundle (wrangler.toml
 * `[alias]`). The MCP SDK client imports ajv for its default output-schema
 * validator, which edgeloop never constructs: it passes its own
 * (`ACCEPT_ANY_OUTPUT`, shared/tools/mcp-tool-client.ts), and ajv's code
 * generation is refused on Workers anyway. Keeps ~280 KB out of the bundle.
 * @throws Error when constructed or called (it never is)
 */
export default class AjvNotBundled {
  constructor() {
    throw new Error("ajv is not bundled into the Worker (edgeloop's MCP client passes its own JSON-Schema validator)");
  }
}
