// Unit tests of the client's logic that needs no server: the event-stream
// parser, the backoff and Retry-After, the version gate and resume ids, the
// single token refresh, when a follow fetches a fresh token and what a 401
// costs, and a room's resume and listings against scripted
// answers of the rooms contract (ids, `event: reset`, the long-poll form:
// what the release binary does not send yet), and presence: the diffing of
// member lists, what each handler gets, and the URLs of a follow as a member
// (member= and info= on streams and waiting long-polls). What it is not: the tests
// against pollbox (server.test.mjs) or in Chromium (browser.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { SseParser } from "../dist/internal/sse.js";
import { Backoff, Renewal } from "../dist/internal/backoff.js";
import { Versions } from "../dist/internal/versions.js";
import { Access } from "../dist/internal/access.js";
import { diffMembers } from "../dist/internal/presence.js";
import { Pollbox } from "../dist/pollbox.js";

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

test("sse: an id takes effect when its event is dispatched, and persists", () => {
  const seen = [];
  const p = new SseParser((e) => seen.push([e.data, p.lastId]));
  p.push("id: w1\ndata: a\n");
  assert.equal(p.lastId, "", "not before its event ends");
  p.push("\ndata: b\n\nid: w2\n\n");
  assert.deepEqual(seen, [["a", "w1"], ["b", "w1"]]);
  assert.equal(p.lastId, "w2", "an id without data still counts");
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
  assert.deepEqual(v.held(), ["b", "a"], "the keys the page has");
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

test("renewal: a flow starts over; a first 401 is mended at once, a refused fresh token waits the capped backoff", () => {
  const b = new Backoff(1000, 4000, () => 0.999);
  const r = new Renewal(b);
  // Streams that flowed and ended with their tokens: never a wait, the backoff stays in its first window.
  for (let i = 0; i < 10; i++) {
    r.flowed();
    r.fetched();
  }
  assert.equal(b.next(), 999, "ten expiries did not grow the backoff");
  r.flowed();
  assert.equal(r.refused(), undefined, "a first 401 since the flow: a fresh token at once, nothing reported");
  const waits = [];
  for (let i = 0; i < 5; i++) {
    r.fetched();
    waits.push(r.refused());
  }
  assert.deepEqual(waits, [999, 1998, 3996, 3996, 3996], "fresh tokens refused: a doubling, capped backoff");
  r.fetched();
  assert.equal(r.refused(2500), 2500, "Retry-After is obeyed");
  r.flowed();
  assert.equal(r.refused(), undefined, "a flow in between: at once again");
  r.fetched();
  assert.equal(r.refused(), 999, "and the backoff starts over");
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

/** A fetch that answers from `script`: one function per request, in order,
 * each given the request's URL; past its end, a stream that stays open. */
function scripted(script) {
  const urls = [];
  const fetch = async (url, init) => {
    urls.push(decodeURIComponent(url.replace(/^http:\/\/x/, "")));
    const next = script.shift();
    if (next) return next(url);
    return new Response(
      new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode("retry: 1000\n\n"));
          init.signal?.addEventListener("abort", () => c.error(new Error("aborted")));
        },
      }),
      { headers: { "Content-Type": "text/event-stream" } },
    );
  };
  return { urls, fetch };
}
const sse = (text) => () => new Response(text, { headers: { "Content-Type": "text/event-stream" } });
const json = (body) => () => new Response(JSON.stringify(body), { headers: { "Content-Type": "application/json" } });
const box = (k, ver) => ({ k, ver, v: ver });
const data = (k, ver) => `data: ${JSON.stringify(box(k, ver))}\n\n`;

function room(fetch, transport) {
  const r = { updates: [], deleted: [], errors: [] };
  const pb = new Pollbox({ url: "http://x", fetch, eventSource: false, backoffMs: 1, waitMs: 50 });
  const f = pb.follow({ prefix: "room-17/" }, {
    update: (p) => r.updates.push(p.k + ":" + p.ver),
    deleted: (k) => r.deleted.push(k),
    error: (e) => r.errors.push(e.status + " " + e.message),
  }, { transport });
  return { r, f };
}

async function settle(urls, n, ms = 1000) {
  for (let end = Date.now() + ms; Date.now() < end && urls.length < n; ) await new Promise((ok) => setTimeout(ok, 5));
  assert.ok(urls.length >= n, urls.join("\n"));
}

test("rooms over streams: last_event_id resumes; event: reset lists the room again, and synced drops the rest", async () => {
  const { urls, fetch } = scripted([
    // No id yet: the listing, then synced with the first id, then live.
    sse("retry: 1000\n\n" + data("room-17/a", 1) + data("room-17/b", 1) + data("room-17/c", 1) +
      "id: w1\nevent: synced\ndata: {}\n\n" + data("room-17/a", 2) + data("room-17/d", 1) + "id: w2\nevent: deleted\ndata: {\"k\":\"room-17/c\"}\n\n"),
    // Resumed from w2: only what moved, nothing dropped.
    sse("retry: 1000\n\n" + data("room-17/b", 2) + "id: w3\nevent: synced\ndata: {}\n\n"),
    // w3 is not honored: reset, the whole room again (a and b, a older than
    // the page's), synced; d was not named: gone. Then a reset mid-stream.
    sse("retry: 1000\n\nevent: reset\ndata: {}\n\n" + data("room-17/a", 1) + data("room-17/b", 2) +
      "id: w4\nevent: synced\ndata: {}\n\n" + data("room-17/e", 1) +
      "event: reset\ndata: {}\n\n" + data("room-17/e", 1) + "id: w5\nevent: synced\ndata: {}\n\n"),
    // A cut listing: nothing dropped until a listing ends.
    sse("retry: 1000\n\nevent: reset\ndata: {}\n\n" + data("room-17/a", 3)),
    // Resumed from w5 again (the cut listing's reset had no id).
    sse("retry: 1000\n\n" + "id: w6\nevent: synced\ndata: {}\n\n"),
  ]);
  const { r, f } = room(fetch);
  await settle(urls, 6);
  f.close();
  await f.done;
  assert.deepEqual(urls.slice(0, 6), [
    "/v1/boxes?prefix=room-17/",
    "/v1/boxes?prefix=room-17/&last_event_id=w2",
    "/v1/boxes?prefix=room-17/&last_event_id=w3",
    "/v1/boxes?prefix=room-17/&last_event_id=w5",
    "/v1/boxes?prefix=room-17/&last_event_id=w5",
    "/v1/boxes?prefix=room-17/&last_event_id=w6",
  ]);
  assert.deepEqual(r.updates, ["room-17/a:1", "room-17/b:1", "room-17/c:1", "room-17/a:2", "room-17/d:1", "room-17/b:2", "room-17/e:1", "room-17/a:3"]);
  assert.deepEqual(r.deleted, ["room-17/c", "room-17/d", "room-17/a", "room-17/b"]);
  assert.deepEqual(r.errors, []);
});

test("rooms over streams: a reconnect without an id lists the room, and drops what it does not name", async () => {
  const { urls, fetch } = scripted([
    sse("retry: 1000\n\n" + data("room-17/a", 1) + data("room-17/b", 1) + "event: synced\ndata: {}\n\n"),
    // A server without ids: each reconnect is a full listing, without reset.
    sse("retry: 1000\n\n" + data("room-17/b", 1) + "event: synced\ndata: {}\n\n"),
  ]);
  const { r, f } = room(fetch);
  await settle(urls, 3);
  f.close();
  await f.done;
  assert.deepEqual(urls.slice(0, 3), Array(3).fill("/v1/boxes?prefix=room-17/"));
  assert.deepEqual(r.updates, ["room-17/a:1", "room-17/b:1"]);
  assert.deepEqual(r.deleted, ["room-17/a"]);
});

test("rooms by long-poll: a walk of the pages, after=W of the last answer, next pages, deleted, reset", async () => {
  const none = () => new Response(null, { status: 304 });
  const { urls, fetch } = scripted([
    // The first time: a walk of the room's pages; `after` of the first page.
    json({ boxes: [box("room-17/a", 1)], next: "c1", after: "W1" }),
    json({ boxes: [box("room-17/b", 1)], next: null, after: "W1b" }),
    // Long-polls from W1: moved boxes, deleted keys, a next page.
    json({ boxes: [box("room-17/c", 1)], deleted: ["room-17/a"], next: "c2", after: "W2" }),
    json({ boxes: [box("room-17/b", 2)], deleted: [], next: null, after: "W2b" }),
    none,
    // W2 is not honored: the whole room, paged; what it does not name is gone.
    json({ reset: true, boxes: [box("room-17/b", 2)], deleted: [], next: "c3", after: "W3" }),
    json({ reset: true, boxes: [box("room-17/d", 1)], deleted: [], next: null, after: "W3" }),
    // An answer without `after` (a server without the long-poll form): the
    // next time, a walk again, after waitMs, which lists the room.
    json({ boxes: [box("room-17/b", 2), box("room-17/d", 2)], next: null }),
    json({ boxes: [box("room-17/d", 2)], next: null }),
  ]);
  const { r, f } = room(fetch, "long-poll");
  await settle(urls, 10);
  f.close();
  await f.done;
  const lp = "/v1/boxes?prefix=room-17/&limit=1000";
  assert.deepEqual(urls.slice(0, 10), [
    lp,
    lp + "&cursor=c1",
    lp + "&after=W1&wait_ms=50",
    lp + "&after=W1&wait_ms=50&cursor=c2",
    lp + "&after=W2&wait_ms=50",
    lp + "&after=W2&wait_ms=50",
    lp + "&after=W2&wait_ms=50&cursor=c3",
    lp + "&after=W3&wait_ms=50",
    lp,
    lp,
  ]);
  assert.deepEqual(r.updates, ["room-17/a:1", "room-17/b:1", "room-17/c:1", "room-17/b:2", "room-17/d:1", "room-17/d:2"]);
  assert.deepEqual(r.deleted, ["room-17/a", "room-17/c", "room-17/b"]);
  assert.deepEqual(r.errors, []);
});

/** A follow of "a" (fetch streams) whose token function and requests are
 * logged in order with their times; `answers` gives the requests' answers in
 * order (past its end, a stream that stays open). */
function tokened(answers, options) {
  const log = [];
  let n = 0;
  const { urls, fetch } = scripted(answers);
  const pb = new Pollbox({
    url: "http://x",
    eventSource: false,
    ...options,
    token: () => {
      const t = "t" + ++n;
      log.push({ what: "token", t, at: performance.now() });
      return t;
    },
    fetch: (url, init) => {
      log.push({ what: "fetch", t: init.headers.Authorization.slice("Bearer ".length), at: performance.now() });
      return fetch(url, init);
    },
  });
  const r = { updates: [], errors: [] };
  const f = pb.follow("a", {
    update: (p) => r.updates.push(p.ver),
    error: (e, fatal) => r.errors.push({ status: e.status, fatal, at: performance.now() }),
  });
  return { log, urls, r, f };
}
const expired = 'event: expired\ndata: {"error":"invalid_token","error_description":"expired"}\n\n';
const unauthorized = () =>
  new Response('{"error":"invalid_token"}', { status: 401, headers: { "WWW-Authenticate": 'Bearer error="invalid_token"' } });

test("tokens: event: expired on a stream that flowed reconnects at once, with a token fetched right before the request", async () => {
  // A backoff of a minute: any wait would stall this test.
  const streams = Array.from({ length: 12 }, (_, i) => sse("retry: 1000\n\n" + data("a", i + 1) + expired));
  const { log, urls, r, f } = tokened(streams, { backoffMs: 60000, maxBackoffMs: 60000 });
  await settle(urls, 13).finally(() => f.close());
  await f.done;
  assert.deepEqual(r.updates, Array.from({ length: 12 }, (_, i) => i + 1));
  assert.deepEqual(r.errors, [], "an expiry is not an error");
  const pairs = log.slice(0, 26);
  for (let i = 0; i < 26; i += 2) {
    assert.deepEqual([pairs[i].what, pairs[i + 1].what], ["token", "fetch"], "a fresh token before each request: " + i);
    assert.equal(pairs[i + 1].t, pairs[i].t, "the request carries the token just fetched");
  }
});

test("tokens: a fresh token refused (401) is reported, not fatal, and the next one is fetched after the backoff, right before its request", async () => {
  const { log, urls, r, f } = tokened(Array.from({ length: 10 }, () => unauthorized), { backoffMs: 200, maxBackoffMs: 400 });
  await settle(urls, 9, 10000).finally(() => f.close());
  await f.done;
  const fetches = log.filter((e) => e.what === "fetch").slice(0, 9);
  const tokensBefore = fetches.map((e) => log[log.indexOf(e) - 1]);
  for (const [i, t] of tokensBefore.entries()) {
    assert.equal(t.what, "token", "a fresh token right before request " + i);
    assert.equal(fetches[i].t, t.t);
    assert.ok(fetches[i].at - t.at < 40, `no wait between the token and its request ${i}: ${fetches[i].at - t.at} ms`);
  }
  // The first 401 (the first token) is mended at once and quietly; each
  // refused fresh token after it is reported, and retried after a backoff.
  assert.ok(r.errors.length >= 7, JSON.stringify(r.errors));
  for (const e of r.errors) assert.deepEqual([e.status, e.fatal], [401, false]);
  const spent = fetches.at(-1).at - fetches[1].at;
  assert.ok(spent > 200, "the retries waited a backoff: " + spent + " ms for 7");
  const gaps = fetches.slice(1).map((e, i) => e.at - fetches[i].at);
  assert.ok(Math.max(...gaps) < 400 + 150, "capped: " + gaps.map(Math.round));
});

test("tokens: a 401 after a stream that flowed and ended is mended at once, without an error", async () => {
  const { log, urls, r, f } = tokened([sse("retry: 1000\n\n" + data("a", 1)), unauthorized], { backoffMs: 50 });
  await settle(urls, 3).finally(() => f.close());
  await f.done;
  // The stream ends (a backoff), the next request's 401 is the old token's: a fresh one at once.
  assert.deepEqual(log.map((e) => e.what + ":" + e.t), ["token:t1", "fetch:t1", "fetch:t1", "token:t2", "fetch:t2"]);
  assert.deepEqual(r.errors, []);
  assert.deepEqual(r.updates, [1]);
});

test("presence: member lists compared by id: joined, left, info changed", () => {
  const a = { id: "alice", info: { n: "A" } };
  const b = { id: "bob" };
  const c = { id: "carol" };
  assert.deepEqual(diffMembers([], [a, b]), { joined: [a, b], left: [], updated: [] });
  assert.deepEqual(diffMembers([a, b], [b, c]), { joined: [c], left: [a], updated: [] });
  const a2 = { id: "alice", info: { n: "A2" } };
  assert.deepEqual(diffMembers([a, b], [a2, b]), { joined: [], left: [], updated: [[a2, a]] });
  assert.deepEqual(diffMembers([b], [{ id: "bob", info: { x: 1 } }]).updated.length, 1, "info given where there was none");
  assert.deepEqual(diffMembers([a, b], [{ id: "alice", info: { n: "A" } }, { id: "bob" }]), { joined: [], left: [], updated: [] });
  assert.deepEqual(diffMembers([a, b, c], []), { joined: [], left: [a, b, c], updated: [] });
});

const pres = (ver, members, count = members?.length) =>
  JSON.stringify(members ? { k: "room-17/~presence", ver, count, members } : { k: "room-17/~presence", ver, count });

/** client.presence over scripted answers, every handler logged in order. */
function watch(fetch, o) {
  const log = [];
  const pb = new Pollbox({ url: "http://x", fetch, eventSource: false, backoffMs: 1, waitMs: 50 });
  const f = pb.presence("room-17/", {
    members: (list, count, ver) => log.push(`members ${list.map((m) => m.id).join(",")} ${count} ${ver}`),
    join: (m) => log.push("join " + m.id),
    leave: (m) => log.push("leave " + m.id),
    update: (m, b) => log.push(`update ${m.id} ${JSON.stringify(b.info)}->${JSON.stringify(m.info)}`),
    count: (n, ver) => log.push(`count ${n} ${ver}`),
    error: (e) => log.push("error " + e.status + " " + e.message),
  }, o);
  return { log, f };
}

test("presence over a stream: the first state is the baseline; then joins, leaves, info updates, count-only states", async () => {
  const ev = (ver, members, count) => `id: ${ver}\ndata: ${pres(ver, members, count)}\n\n`;
  const { urls, fetch } = scripted([
    sse("retry: 1000\n\n" + ev(10, [{ id: "alice" }, { id: "bob" }]) + ev(11, [{ id: "alice" }, { id: "bob" }, { id: "carol" }]) +
      ev(12, [{ id: "bob", info: { n: 1 } }, { id: "carol" }])),
    // A reconnect: the same state again is dropped, the diff goes on from the last.
    sse("retry: 1000\n\n" + ev(12, [{ id: "bob", info: { n: 1 } }, { id: "carol" }]) + ev(13, null, 150) + ev(14, null, 151) +
      ev(15, [{ id: "carol" }, { id: "dave" }])),
  ]);
  const { log, f } = watch(fetch);
  await settle(urls, 3);
  f.close();
  await f.done;
  assert.deepEqual(urls.slice(0, 3), [
    "/v1/boxes?keys=room-17/~presence",
    "/v1/boxes?keys=room-17/~presence&last_event_id=c",
    "/v1/boxes?keys=room-17/~presence&last_event_id=f",
  ]);
  assert.deepEqual(log, [
    "members alice,bob 2 10",
    "join carol",
    "members alice,bob,carol 3 11",
    "leave alice",
    "update bob undefined->{\"n\":1}",
    "members bob,carol 2 12",
    "count 150 13",
    "count 151 14",
    "leave bob",
    "join dave",
    "members carol,dave 2 15",
  ]);
});

test("presence as a member: member= and info= on the presence box's own stream and long-polls", async () => {
  const info = { name: "Alice & co", n: 1 };
  const q = "member=al ice&info=" + JSON.stringify(info);
  const one = scripted([sse("retry: 1000\n\n" + `id: 7\ndata: ${pres(7, [{ id: "al ice", info }])}\n\n`)]);
  const s = watch(one.fetch, { member: "al ice", info });
  await settle(one.urls, 2);
  s.f.close();
  await s.f.done;
  assert.deepEqual(one.urls.slice(0, 2), ["/v1/boxes/room-17/~presence?" + q, "/v1/boxes/room-17/~presence?last_event_id=7&" + q]);
  assert.deepEqual(s.log, ["members al ice 1 7"]);

  const none = () => new Response(null, { status: 304 });
  const lp = scripted([json(JSON.parse(pres(7, [{ id: "al ice" }]))), none, json(JSON.parse(pres(9, [])))]);
  const l = watch(lp.fetch, { member: "al ice", info, transport: "long-poll" });
  await settle(lp.urls, 4);
  l.f.close();
  await l.f.done;
  const p = "/v1/boxes/room-17/~presence?";
  assert.deepEqual(lp.urls.slice(0, 4), [
    p + "after=0&wait_ms=50&" + q,
    p + "after=7&wait_ms=50&" + q,
    p + "after=7&wait_ms=50&" + q,
    p + "after=9&wait_ms=50&" + q,
  ]);
  assert.deepEqual(l.log, ["members al ice 1 7", "leave al ice", "members  0 9"]);
  // The raw URL: every parameter percent-encoded.
  const raw = [];
  const pb = new Pollbox({ url: "http://x", eventSource: false, fetch: async (url) => (raw.push(url), new Response(null, { status: 400 })) });
  await pb.presence("room-17/", {}, { member: "al ice", info }).done;
  assert.equal(raw[0], "http://x/v1/boxes/room-17%2F~presence?member=al%20ice&info=%7B%22name%22%3A%22Alice%20%26%20co%22%2C%22n%22%3A1%7D");
});

test("a room followed as a member: member= on its streams and its waiting long-polls, not on the pages of a first walk", async () => {
  const s = scripted([sse("retry: 1000\n\nid: w1\nevent: synced\ndata: {}\n\n")]);
  const pb = new Pollbox({ url: "http://x", fetch: s.fetch, eventSource: false, backoffMs: 1, waitMs: 50 });
  const f = pb.follow({ prefix: "room-17/" }, { update() {} }, { member: "bob" });
  await settle(s.urls, 2);
  f.close();
  await f.done;
  assert.deepEqual(s.urls.slice(0, 2), ["/v1/boxes?prefix=room-17/&member=bob", "/v1/boxes?prefix=room-17/&last_event_id=w1&member=bob"]);

  const l = scripted([
    json({ boxes: [box("room-17/a", 1)], next: "c1", after: "W1" }),
    json({ boxes: [], next: null, after: "W1" }),
    json({ boxes: [box("room-17/b", 1)], next: "c2", after: "W2" }),
    json({ boxes: [], next: null, after: "W2" }),
  ]);
  const g = new Pollbox({ url: "http://x", fetch: l.fetch, eventSource: false, backoffMs: 1, waitMs: 50 })
    .follow({ prefix: "room-17/" }, { update() {} }, { member: "bob", transport: "long-poll" });
  await settle(l.urls, 5);
  g.close();
  await g.done;
  const lp = "/v1/boxes?prefix=room-17/&limit=1000";
  assert.deepEqual(l.urls.slice(0, 5), [
    lp,
    lp + "&cursor=c1",
    lp + "&after=W1&wait_ms=50&member=bob",
    lp + "&after=W1&wait_ms=50&member=bob&cursor=c2",
    lp + "&after=W2&wait_ms=50&member=bob",
  ]);
});

test("presence in an EventSource: member= on the stream, not on the plain poll that asks why it failed", async () => {
  const opened = [];
  globalThis.EventSource = class {
    constructor(url) {
      opened.push(decodeURIComponent(url.replace(/^http:\/\/x/, "")));
      setTimeout(() => this.onerror?.(), 1);
    }
    addEventListener() {}
    close() {}
  };
  try {
    const { urls, fetch } = scripted([json({ boxes: [], next: null }), () => new Response('{"error":"forbidden"}', { status: 403 })]);
    const errors = [];
    const pb = new Pollbox({ url: "http://x", fetch, backoffMs: 1, token: "t", tokenIn: "query" });
    await pb.follow({ prefix: "room-17/" }, { update() {}, error: (e, fatal) => errors.push([e.status, fatal]) }, { member: "bob" }).done;
    assert.deepEqual(opened, ["/v1/boxes?prefix=room-17/&member=bob&access_token=t", "/v1/boxes?prefix=room-17/&member=bob&access_token=t"]);
    assert.deepEqual(urls, ["/v1/boxes?prefix=room-17/&access_token=t", "/v1/boxes?prefix=room-17/&access_token=t"]);
    assert.deepEqual(errors, [[403, true]]);
  } finally {
    delete globalThis.EventSource;
  }
});

test("member needs a room or a room's presence key; info needs member", () => {
  const pb = new Pollbox({ url: "http://x", fetch: async () => new Response(null, { status: 400 }) });
  const h = { update() {} };
  assert.throws(() => pb.follow("scores", h, { member: "a" }), TypeError);
  assert.throws(() => pb.follow({ keys: ["room-17/~presence", "room-17/scores"] }, h, { member: "a" }), TypeError);
  assert.throws(() => pb.follow({ prefix: "room-17/" }, h, { info: { n: 1 } }), TypeError);
  assert.throws(() => pb.presence("room-17", {}), TypeError, "a room ends with a separator");
  pb.presence("tenant:4:", {}).close();
  pb.follow("room-17/~presence", h, { member: "a" }).close();
  pb.follow({ key: "~presence" }, h, { member: "a" }).close();
});

test("presence pages: limit and cursor on the presence box", async () => {
  const { urls, fetch } = scripted([
    json({ k: "room-17/~presence", ver: 5, count: 3, members: [{ id: "a" }, { id: "b" }], next: "62" }),
    json({ k: "room-17/~presence", ver: 5, count: 3, members: [{ id: "c" }], next: null }),
  ]);
  const pb = new Pollbox({ url: "http://x", fetch });
  const p1 = await pb.presencePage("room-17/", { limit: 2 });
  assert.deepEqual(p1.members.map((m) => m.id), ["a", "b"]);
  const p2 = await pb.presencePage("room-17/", { limit: 2, cursor: p1.next });
  assert.equal(p2.next, null);
  assert.deepEqual(urls, ["/v1/boxes/room-17/~presence?limit=2", "/v1/boxes/room-17/~presence?limit=2&cursor=62"]);
});
