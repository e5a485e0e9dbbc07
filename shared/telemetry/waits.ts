/**
 * What a running session waits on at one moment: `engine` (a generation
 * call), `tool` (a tool webhook, by tool name), `agent` (an external agent's
 * calls and finish, `openai_agent`), or `reward` (a reward webhook).
 */
export interface SessionWait {
  kind: "engine" | "tool" | "agent" | "reward";
  /** The tool's name (`tool`) or the agent's URL (`agent`); absent otherwise. */
  name?: string;
}

/** A {@link SessionWait} with how many calls of this process wait on it now. */
export interface WaitCount extends SessionWait {
  count: number;
}

/**
 * Counts the calls this process's sessions are waiting on right now (N5: a
 * stall warning names what the running sessions wait on instead of always
 * blaming the engine). Each call site brackets its wait with {@link begin}
 * and the returned `end`; {@link snapshot} lists the open ones, most first.
 * Plain counters, no timers: cheap enough to run on every engine call.
 */
export class WaitTracker {
  private readonly open = new Map<string, WaitCount>();

  /** Marks one wait begun; the returned function ends it (calling it again does nothing). */
  begin(wait: SessionWait): () => void {
    const id = `${wait.kind}\u0000${wait.name ?? ""}`;
    const cur = this.open.get(id);
    if (cur) cur.count++;
    else this.open.set(id, { ...wait, count: 1 });
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const c = this.open.get(id);
      if (!c) return;
      if (--c.count <= 0) this.open.delete(id);
    };
  }

  /** Waits open now, most calls first (ties: engine, tool, agent, reward, then by name). */
  snapshot(): WaitCount[] {
    const order = { engine: 0, tool: 1, agent: 2, reward: 3 } as const;
    return [...this.open.values()].map((w) => ({ ...w })).sort((a, b) => b.count - a.count || order[a.kind] - order[b.kind] || (a.name ?? "").localeCompare(b.name ?? ""));
  }
}

/**
 * The process's tracker: the trajectory tracer's engine and tool wrappers, the
 * `openai_agent` loop and the reward span bracket their calls with it, and
 * `edgeloop rollout`'s stall warning reads it.
 */
export const sessionWaits = new WaitTracker();
