import { describe, expect, test } from "bun:test";
import { EngineControl, MemoryEngineGate } from "../../shared/inference/engine-control.ts";
import { EngineUnavailableError } from "../../shared/errors.ts";

// A pause that fails at one replica is all-or-nothing: the replicas that paused are resumed and the gate
// opened, so a 502 always means nothing is paused (a fresh user's finding: a failed pause left the gate
// shut, blocking every engine call of a trainer that read the 502 as "not paused").
describe("EngineControl: a failed pause is rolled back", () => {
  test("one replica without the pause API: 502 naming it, the other replica resumed, the gate open", async () => {
    const gate = new MemoryEngineGate();
    const log: string[] = [];
    const replica = (url: string, ok: boolean) => ({
      url,
      fetch: async (u: string | URL | Request) => {
        log.push(`${url} ${new URL(String(u)).pathname}`);
        return ok ? Response.json({ status: "ok" }) : new Response("no route", { status: 404 });
      },
    });
    const control = new EngineControl({ gate, format: "vllm", replicas: () => [replica("http://r0", true), replica("http://r1", false)] });
    const err = await control.pause({ mode: "abort", clear_cache: false }).catch((e) => e);
    expect(err).toBeInstanceOf(EngineUnavailableError);
    expect(err.status).toBe(502);
    expect(err.message).toBe(
      "engine pause failed at http://r1 (HTTP 404: no route); rolled back: the replicas that paused were resumed and the gate is open, nothing is paused",
    );
    expect(log).toEqual(["http://r0 /pause", "http://r1 /pause", "http://r0 /resume", "http://r1 /resume"]);
    expect((await gate.state()).paused).toBe(false);
    // The gate lets calls through at once.
    expect(await gate.run(async () => "sent")).toBe("sent");
  });
});
