import { describe, expect, test } from "bun:test";
import { createHmac } from "node:crypto";
import { constantTimeEqual, signatureHeader, verifySignature } from "../../shared/tools/signature.ts";

const body = '{"call_id":"u_0_0:1:0","name":"calc"}';

describe("webhook signatures", () => {
  test("header format and digest equal an independent HMAC-SHA256", async () => {
    const h = await signatureHeader("s3cret", body, 1700000000.7);
    const hex = createHmac("sha256", "s3cret").update(`1700000000.${body}`).digest("hex");
    expect(h).toBe(`t=1700000000,v1=${hex}`);
  });
  test("good signature verifies", async () => {
    const h = await signatureHeader("s3cret", body, 1700000000);
    expect(await verifySignature("s3cret", h, body, 1700000100)).toBe(true);
  });
  test("bad: wrong secret, changed body, garbage, missing", async () => {
    const h = await signatureHeader("s3cret", body, 1700000000);
    expect(await verifySignature("other", h, body, 1700000000)).toBe(false);
    expect(await verifySignature("s3cret", h, body + " ", 1700000000)).toBe(false);
    expect(await verifySignature("s3cret", "t=1700000000,v1=00", body, 1700000000)).toBe(false);
    expect(await verifySignature("s3cret", "nonsense", body, 1700000000)).toBe(false);
    expect(await verifySignature("s3cret", undefined, body, 1700000000)).toBe(false);
    expect(await verifySignature("s3cret", null, body, 1700000000)).toBe(false);
  });
  test("stale or future timestamps outside the window fail", async () => {
    const h = await signatureHeader("s3cret", body, 1700000000);
    expect(await verifySignature("s3cret", h, body, 1700000300)).toBe(true);
    expect(await verifySignature("s3cret", h, body, 1700000301)).toBe(false);
    expect(await verifySignature("s3cret", h, body, 1699999699)).toBe(false);
    expect(await verifySignature("s3cret", h, body, 1700000010, 5)).toBe(false);
  });
  test("several v1 digests (secret rotation): any match passes", async () => {
    const h = await signatureHeader("new", body, 1700000000);
    const old = (await signatureHeader("old", body, 1700000000)).split(",")[1];
    expect(await verifySignature("new", `${h},${old}`, body, 1700000000)).toBe(true);
    expect(await verifySignature("old", `${h},${old}`, body, 1700000000)).toBe(true);
  });
  test("constantTimeEqual", () => {
    expect(constantTimeEqual("abc", "abc")).toBe(true);
    expect(constantTimeEqual("abc", "abd")).toBe(false);
    expect(constantTimeEqual("abc", "ab")).toBe(false);
  });
});
