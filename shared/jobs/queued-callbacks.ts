import type { SessionHost } from "../session/session-host.ts";
import type { ToolResultDelivery } from "../session/trajectory-session.ts";
import type { JobQueue } from "./job-queue.ts";

/** What the sessions function (`functions/sessions.ts`) calls for callbacks and status queries. */
export interface QueuedCallbacks {
  deliver(key: string, result: ToolResultDelivery): Promise<void>;
  status(key: string): ReturnType<SessionHost["status"]>;
}

/**
 * The tool-result callbacks of an API process in queue mode (DESIGN §4.6):
 * a callback only commits the result into the session's checkpoint (fenced
 * by its step; {@link SessionHost.deliverOnly}) and then announces it on
 * the wake stream ({@link JobQueue.wake}); the worker that runs the session
 * continues it at once (`JobWorker` `onWake`). The API process never
 * continues a session itself, so it makes no engine or tool calls. If the
 * wake cannot be written the result stays committed and the worker
 * continues the session at the tool's deadline at the latest (or, when that
 * worker died, whoever reclaims its job resumes from the checkpoint).
 * @param log receives one line when a wake could not be written.
 */
export function queuedCallbacks(host: SessionHost, jobs: JobQueue, log?: (line: string) => void): QueuedCallbacks {
  return {
    async deliver(key, result) {
      await host.deliverOnly(key, result);
      for (let i = 0; ; i++) {
        try {
          await jobs.wake(key);
          return;
        } catch (e) {
          if (i >= 2) {
            log?.(`wake for ${key.slice(0, 200)} not written (${(e as Error)?.message ?? e}); its worker continues it at the tool's deadline`);
            return;
          }
          await new Promise((r) => setTimeout(r, 100 * 3 ** i));
        }
      }
    },
    status: (key) => host.status(key),
  };
}
