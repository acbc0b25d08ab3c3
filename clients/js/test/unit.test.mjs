// Unit tests of the client's logic that needs no server: the event-stream
// parser, the backoff and Retry-After, the version gate and resume ids, the
// single token refresh. What it is not: the tests against pollbox
// (server.test.mjs) or in Chromium (browser.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { SseParser } from "../dist/internal/sse.js";
import { Backoff } from "../dist/internal/backoff.js";
import { Versions } from "../dist/internal/versions.js";
import { Access } from "../dist/internal/access.js";

function parse(chunks) {
  const events = [];
  const p = new SseParser((e) => events.push(e));
  for (const c of chunks) p.push(c);
  return { events, p };
}

test("sse: pollbox's stream, split anywhere, gives the same events", () => {
  const text =
    'retry: 1000\n\nid: 17\ndata: {"k":"a","ver":17}\n\n:\n\nevent: deleted\ndata: {"k":"a"}\n\n' +
    "event: deleted\ndata:\n\nevent: expired\ndata: {\"error\":\"invalid_token\"}\n\n";
  const whole = parse([text]);
  assert.equal(whole.p.retry, 1000);
  assert.equal(whole.p.lastId, "17");
  assert.deepEqual(whole.events, [
    { event: "", data: '{"k":"a","ver":17}' },
    { event: "deleted", data: '{"k":"a"}' },
    { event: "deleted", data: "" },
    { event: "expired", data: '{"error":"invalid_token"}' },
  ]);
  for (let cut = 1; cut < text.length; cut++) {
    assert.deepEqual(parse([text.slice(0, cut), text.slice(cut)]).events, whole.events, "cut at " + cut);
  }
});

test("sse: CRLF lines, multi-line data, comments and events without data", () => {
  const { events } = parse(["data: a\r\ndata: b\r\n\r\n: hi\n\nevent: x\n\nid: 3\n\n"]);
  assert.deepEqual(events, [{ event: "", data: "a\nb" }]);
});

test("backoff: full jitter within a doubling window, capped, reset", () => {
  let r = 0.999;
  const b = new Backoff(1000, 8000, () => r);
  assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [999, 1998, 3996, 7992, 7992]);
  b.reset();
  r = 0;
  assert.equal(b.next(), 0, "the first window starts at 0: a crowd spreads over it");
  const firsts = Array.from({ length: 1000 }, () => new Backoff(1000, 30000).next());
  assert.ok(Math.max(...firsts) - Math.min(...firsts) > 800, "first delays spread over the window");
});

test("backoff: Retry-After in seconds or as a date, plus jitter; none or junk is undefined", () => {
  const b = new Backoff(1000, 30000, () => 0.5);
  assert.equal(b.retryAfter("3"), 3500);
  assert.equal(b.retryAfter(new Date(10_000).toUTCString(), 4_000), 6500);
  assert.equal(b.retryAfter(null), undefined);
  assert.equal(b.retryAfter("soon"), undefined);
});

test("versions: never an older or the same version after a newer one; deletion kept apart", () => {
  const v = new Versions();
  assert.ok(v.accept({ k: "a", ver: 5 }));
  assert.ok(!v.accept({ k: "a", ver: 5 }), "the same again");
  assert.ok(!v.accept({ k: "a", ver: 4 }), "older");
  assert.ok(v.accept({ k: "b", ver: 1 }), "versions are per key");
  assert.ok(v.remove("a"));
  assert.ok(!v.remove("a"), "reported once");
  assert.ok(!v.accept({ k: "a", ver: 5 }), "a deleted box's old version stays refused");
  assert.ok(v.accept({ k: "a", ver: 9 }), "a new incarnation starts past it");
  assert.equal(v.highest(), 9);
});

test("versions: the resume id of many boxes is each version in hex, empty for boxes not held", () => {
  const v = new Versions();
  assert.equal(v.resumeId(["a", "b"]), "", "nothing held: resume nothing");
  v.accept({ k: "a", ver: 255 });
  v.accept({ k: "c", ver: 4096 });
  v.accept({ k: "b", ver: 1 });
  v.remove("b");
  assert.equal(v.resumeId(["a", "b", "c", "d"]), "ff,,1000,");
});

test("tokens: one refresh in flight; a stale caller after it gets the new token without a call", async () => {
  let calls = 0;
  let release;
  const a = new Access({
    url: "http://x/",
    token: () => {
      calls++;
      return new Promise((ok) => (release = () => ok("t" + calls)));
    },
  });
  const first = a.current();
  await new Promise((ok) => setTimeout(ok, 0));
  const second = a.current();
  release();
  assert.equal(await first, "t1");
  assert.equal(await second, "t1");
  assert.equal(calls, 1);
  // Two requests refused with t1 refresh together: one call.
  const r1 = a.refresh("t1");
  const r2 = a.refresh("t1");
  await new Promise((ok) => setTimeout(ok, 0));
  release();
  await Promise.all([r1, r2]);
  assert.equal(calls, 2);
  assert.equal(await a.current(), "t2");
  await a.refresh("t1"); // refused with the old one, after the refresh: nothing to do
  assert.equal(calls, 2);
});

test("tokens: header, query or cookie, as docs/private-boxes.md says", async () => {
  const h = await new Access({ url: "http://x", token: "s3" }).request("/v1/boxes", [["keys", "a,b"]], {});
  assert.equal(h[0], "http://x/v1/boxes?keys=a,b");
  assert.equal(h[1].headers.Authorization, "Bearer s3");
  const q = await new Access({ url: "http://x", token: "a b", tokenIn: "query" }).request("/v1/boxes/k", [], {});
  assert.equal(q[0], "http://x/v1/boxes/k?access_token=a%20b");
  assert.equal(q[1].headers.Authorization, undefined);
  const c = await new Access({ url: "http://x", token: () => undefined, tokenIn: "cookie" }).request("/p", [], {});
  assert.equal(c[1].credentials, "include");
  assert.equal(c[1].headers.Authorization, undefined);
});
