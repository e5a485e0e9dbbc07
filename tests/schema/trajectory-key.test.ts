import { describe, expect, test } from "bun:test";
import { InputError } from "../../shared/errors.ts";
import { trajectoryKey, Uid } from "../../shared/schema/index.ts";

describe("trajectoryKey: uids checked by hand, zod's messages for bad ones", () => {
  test("valid uids give {uid}_{session_id}_{output_index}", () => {
    expect(trajectoryKey("gsm8k-0.a.b", 3)).toBe("gsm8k-0.a.b_3_0");
    expect(trajectoryKey("x".repeat(128), 0, 2)).toBe(`${"x".repeat(128)}_0_2`);
  });
  test("every bad uid fails with zod's own message, field uid", () => {
    // ':' separates Redis key words (S4: uid `g:keys` named group g's key set).
    for (const bad of ["", "a_b", "g:keys", "x".repeat(129), "naïve", 7 as unknown as string]) {
      const want = Uid.safeParse(bad).error!.issues[0]!.message;
      let got: unknown;
      try {
        trajectoryKey(bad, 0);
      } catch (e) {
        got = e;
      }
      expect(got).toBeInstanceOf(InputError);
      expect((got as InputError).message).toContain(want);
      expect((got as InputError & { field?: string }).field).toBe("uid");
    }
  });
});
