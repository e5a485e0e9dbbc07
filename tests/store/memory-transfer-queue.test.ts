import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { transferQueueContract } from "./contract.ts";
import { teacherLogProbsContract } from "./teacher-contract.ts";

transferQueueContract("memory", { open: (opts) => new MemoryTransferQueue(opts), sharesState: false }, "mem:");
teacherLogProbsContract("memory", { open: (opts) => new MemoryTransferQueue(opts), sharesState: false }, "mem:");
