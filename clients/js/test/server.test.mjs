// The client against the real server (the release binary, started here):
// each feature of the contract in docs/clients.md as a case. Run with
// `npm test` after `cargo build --release -p pollbox`.
// What it is not: the page's view in Chromium (browser.test.mjs) or the
// cluster behind HAProxy (cluster.test.mjs).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Pollbox as Client } from "../dist/pollbox.js";
import { GAP_MS, Pollbox, Proxy, Tokens, freePort, longest, sleep, until, writer } from "./harness.mjs";

const cleanup = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});
async function server(toml = "", opts) {
  const s = await Pollbox.start(toml, opts);
  cleanup.push(() => s.close());
  return s;
}
async function proxy(port, mode) {
  const p = await Proxy.start(port, mode);
  cleanup.push(() => p.close());
  return p;
}

/** What a follow handed over: payloads per key, deletions, modes, errors; and
 * a check that no key ever got a version older than (or equal to) one before. */
function recorder() {
  const r = { updates: [], last: {}, deleted: [], modes: [], errors: [], older: [] };
  r.handlers = {
    update(p) {
      const before = r.last[p.k];
      if (before && before.ver >= p.ver) r.older.push([before.ver, p.ver]);
      r.last[p.k] = p;
      r.updates.push(p);
    },
    deleted(k) {
      r.deleted.push(k);
      delete r.last[k];
    },
    mode(m) {
      r.modes.push(m);
    },
    error(e, fatal) {
      r.errors.push({ status: e.status, message: e.message, fatal, retryAfterMs: e.retryAfterMs, at: Date.now() });
    },
  };
  r.has = (k, v) => r.last[k]?.v === v;
  return r;
}

test("read: 200 with its ETag, 304 with it (no body), 404; many boxes with one ETag", async () => {
  const s = await server();
  const pb = new Client(s.url);
  const made = await s.ingest("r-1", 5, { player: "p-7" });
  const r = await pb.read("r-1");
  assert.equal(r.status, 200);
  assert.equal(r.etag, `"${made.ver}"`);
  assert.deepEqual(r.payload, made);
  assert.deepEqual(await pb.read("r-1", { etag: r.etag }), { status: 304, etag: r.etag });
  assert.deepEqual(await pb.read("nope"), { status: 404 });
  const m = await pb.readMany(["r-1", "a/b,c", "zz"]);
  assert.equal(m.status, 200);
  assert.deepEqual(m.payloads, [made, null, null]);
  assert.equal((await pb.readMany(["r-1", "a/b,c", "zz"], { etag: m.etag })).status, 304);
  await s.ingest("a/b,c", 1);
  const m2 = await pb.readMany(["r-1", "a/b,c", "zz"], { etag: m.etag });
  assert.equal(m2.status, 200);
  assert.equal(m2.payloads[1].k, "a/b,c");
});

test("follow one box over a stream: the box at once, each update, deleted, created again", async () => {
  const s = await server();
  const pb = new Client({ url: s.url, backoffMs: 100 });
  await s.ingest("one", 1);
  const r = recorder();
  const f = pb.follow("one", r.handlers);
  await until("the box", () => r.has("one", 1));
  await s.ingest("one", 2);
  await until("the update", () => r.has("one", 2));
  assert.equal(await s.remove("one"), 204);
  await until("deleted", () => r.deleted.includes("one"));
  await s.ingest("one", 3);
  await until("the box created again", () => r.has("one", 3));
  f.close();
  await f.done;
  assert.deepEqual(r.modes, ["stream"]);
  assert.deepEqual(r.updates.map((p) => p.v), [1, 2, 3]);
  assert.deepEqual(r.older, []);
  assert.deepEqual(r.errors, []);
});

test("follow many boxes (keys that need escaping, more than 64 of them) on streams", async () => {
  const s = await server();
  const pb = new Client({ url: s.url, backoffMs: 100 });
  const keys = Array.from({ length: 70 }, (_, i) => `m-${i}`);
  keys[3] = "room 3/a,b ü";
  const r = recorder();
  const f = pb.follow({ keys }, r.handlers);
  for (const [i, k] of keys.entries()) await s.ingest(k, i);
  await until("every box", () => keys.every((k, i) => r.has(k, i)));
  await s.remove(keys[3]);
  await s.ingest(keys[69], 1000);
  await until("deleted and updated", () => r.deleted.includes(keys[3]) && r.has(keys[69], 1000));
  f.close();
  await f.done;
  assert.deepEqual(r.older, []);
  assert.deepEqual(r.errors, []);
});

test("a buffering proxy: the stream does not flow, long-polls do; the stream is tried again later", async () => {
  const s = await server();
  const p = await proxy(s.port, "buffer");
  const pb = new Client({ url: p.url, firstByteMs: 300, streamRetryMs: 1500, waitMs: 1000, backoffMs: 100 });
  await s.ingest("fb", 1);
  const r = recorder();
  const f = pb.follow({ keys: ["fb", "fb-2"] }, r.handlers);
  await until("the box by long-poll", () => r.has("fb", 1));
  assert.deepEqual(r.modes, ["long-poll"]);
  await s.ingest("fb", 2);
  await s.ingest("fb-2", 1);
  await until("updates by long-poll", () => r.has("fb", 2) && r.has("fb-2", 1));
  await s.remove("fb");
  await until("deleted by long-poll", () => r.deleted.includes("fb"));
  // The proxy stops buffering: the next try of the stream flows.
  p.mode = "pass";
  await until("back on a stream", () => r.modes.at(-1) === "stream", 10000);
  await s.ingest("fb", 3);
  await until("the update on the stream", () => r.has("fb", 3));
  f.close();
  await f.done;
  const streams = p.requests.filter((q) => q.headers.accept === "text/event-stream");
  assert.ok(streams.length >= 2, "the stream was tried again");
  const polls = p.requests.filter((q) => q.url.includes("wait_ms="));
  assert.ok(polls.some((q) => q.headers["if-none-match"]), "long-polls carry the many-box ETag");
  assert.deepEqual(r.older, []);
});

test("resume: reconnects after cut connections send last_event_id and hand over only what is newer", async () => {
  const s = await server();
  const p = await proxy(s.port, "pass");
  const pb = new Client({ url: p.url, backoffMs: 50 });
  const r = recorder();
  await s.ingest("cut-a", 1);
  await s.ingest("cut-b", 1);
  const f = pb.follow({ keys: ["cut-a", "cut-b"] }, r.handlers);
  await until("both", () => r.has("cut-a", 1) && r.has("cut-b", 1));
  for (let round = 2; round <= 6; round++) {
    p.cut();
    await s.ingest("cut-a", round);
    await until("round " + round, () => r.has("cut-a", round));
  }
  f.close();
  await f.done;
  const streams = p.requests.filter((q) => q.headers.accept === "text/event-stream");
  assert.ok(streams.length >= 6, streams.length);
  const a = await s.box("cut-a");
  const b = await s.box("cut-b");
  for (const q of streams.slice(1)) assert.match(q.url, /last_event_id=[0-9a-f]+,[0-9a-f]+/, q.url);
  assert.ok(streams.at(-1).url.endsWith(`last_event_id=${(a.ver - 1).toString(16)},${b.ver.toString(16)}`), streams.at(-1).url);
  assert.equal(r.updates.filter((u) => u.k === "cut-b").length, 1, "cut-b did not move: sent once");
  assert.deepEqual(r.updates.filter((u) => u.k === "cut-a").map((u) => u.v), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(r.older, []);
});

test("server restarts (SIGTERM, kill -9) with a snapshot: the client comes back, never older", async () => {
  const s = await server('[snapshot]\npath = "$DIR/boxes.snap"\ninterval_s = 1\n');
  const pb = new Client({ url: s.url, backoffMs: 100, maxBackoffMs: 400 });
  const r = recorder();
  await s.ingest("rs", 1);
  const f = pb.follow("rs", r.handlers);
  await until("the box", () => r.has("rs", 1));
  for (const [sig, v] of [["SIGTERM", 2], ["SIGKILL", 3]]) {
    await s.ingest("rs", v * 10);
    await until("before " + sig, () => r.has("rs", v * 10));
    if (sig === "SIGKILL") await sleep(1500); // let a snapshot take it
    await s.stop(sig);
    await sleep(500);
    await s.start();
    await s.ingest("rs", v);
    await until("after " + sig, () => r.has("rs", v));
  }
  f.close();
  await f.done;
  assert.deepEqual(r.last.rs, await s.box("rs"), "the server's exact state");
  assert.deepEqual(r.older, []);
  assert.ok(r.errors.some((e) => e.status === 0), "the outage was seen");
});

test("backoff: reconnects to a server that is down are jittered and capped", async () => {
  const s = await server();
  const pb = new Client({ url: s.url, backoffMs: 100, maxBackoffMs: 400 });
  const r = recorder();
  await s.ingest("bo", 1);
  const f = pb.follow("bo", r.handlers);
  await until("the box", () => r.has("bo", 1));
  await s.stop("SIGKILL");
  await sleep(4000);
  await s.start();
  await s.ingest("bo", 2);
  await until("back", () => r.has("bo", 2));
  f.close();
  await f.done;
  const at = r.errors.filter((e) => e.status === 0).map((e) => e.at);
  const gaps = at.slice(1).map((t, i) => t - at[i]);
  assert.ok(at.length >= 8, "kept trying: " + at.length);
  assert.ok(Math.max(...gaps) <= 400 + 150, "capped at 400 ms: " + gaps);
  assert.ok(new Set(gaps.map((g) => Math.round(g / 20))).size > 3, "jittered: " + gaps);
});

test("Retry-After: a 429 is obeyed (streams per client capped at 1)", async () => {
  const s = await server("[limits]\nmax_streams_per_ip = 1\n");
  const pb = new Client({ url: s.url, backoffMs: 50 });
  await s.ingest("ra", 1);
  const first = recorder();
  const f1 = pb.follow("ra", first.handlers);
  await until("the first stream", () => first.has("ra", 1));
  const second = recorder();
  const f2 = pb.follow("ra", second.handlers);
  await until("three refusals", () => second.errors.length >= 3, 10000);
  f1.close();
  await until("the second stream once the first is gone", () => second.has("ra", 1), 10000);
  f2.close();
  await Promise.all([f1.done, f2.done]);
  const refusals = second.errors.filter((e) => e.status === 429);
  assert.ok(refusals.length >= 3);
  for (const e of refusals) assert.ok(e.retryAfterMs >= 1000, "Retry-After: 1 -> at least 1 s: " + e.retryAfterMs);
  const gaps = refusals.slice(1).map((e, i) => e.at - refusals[i].at);
  for (const g of gaps) assert.ok(g >= 990, "each try waited Retry-After: " + gaps);
});

test("tokens in a header: refreshed once on 401 and on event: expired (a signed token that ends)", async () => {
  let tokens;
  const s = await server('[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\nleeway_s = 0\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  const ingestToken = tokens.mint(["*"], 600);
  const auth = { Authorization: "Bearer " + ingestToken };
  await s.ingest("room-1/a", 1, {}, auth);
  let calls = 0;
  let stale = true;
  const pb = new Client({
    url: s.url,
    backoffMs: 100,
    token: async () => {
      calls++;
      await sleep(100);
      if (stale) {
        stale = false;
        return tokens.mint(["room-1/*"], -60); // already ended: a 401
      }
      return tokens.mint(["room-1/*"], 3); // ends while the stream runs
    },
  });
  // Three reads refused with the same stale token refresh once between them.
  const reads = await Promise.all([pb.read("room-1/a"), pb.read("room-1/a"), pb.read("room-1/a")]);
  assert.deepEqual(reads.map((x) => x.status), [200, 200, 200]);
  assert.equal(calls, 2, "one call for the first token, one refresh for three 401s");
  const r = recorder();
  const f = pb.follow("room-1/a", r.handlers);
  await until("the box", () => r.has("room-1/a", 1));
  await sleep(4000); // the token ends: event: expired, a fresh one, the stream again
  await s.ingest("room-1/a", 2, {}, auth);
  await until("the update after the refresh", () => r.has("room-1/a", 2), 10000);
  f.close();
  await f.done;
  assert.ok(calls >= 3, "refreshed on expired: " + calls);
  assert.deepEqual(r.errors.filter((e) => e.fatal), []);
  assert.deepEqual(r.older, []);
  await assert.rejects(new Client(s.url).read("room-1/a"), (e) => e.status === 401);
});

test("tokens that end every 2-3 s on a box written 20 times a second: each expiry reconnects at once with a fresh token, no stall", async () => {
  let tokens;
  const s = await server('[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\nleeway_s = 0\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  const auth = { Authorization: "Bearer " + tokens.mint(["*"], 600) };
  await s.ingest("exp/a", 0, {}, auth);
  const calls = [];
  // The client's defaults (backoffMs 1000, maxBackoffMs 30000), as a page has them.
  const pb = new Client({
    url: s.url,
    token: () => {
      calls.push(Date.now());
      return tokens.mint(["exp/*"], 3);
    },
  });
  const r = recorder();
  const at = [];
  const update = r.handlers.update;
  r.handlers.update = (p) => {
    at.push(Date.now());
    update(p);
  };
  const f = pb.follow("exp/a", r.handlers);
  await until("the box", () => r.has("exp/a", 0));
  const w = writer(s, "exp/a", auth);
  // Ten expiries (eleven tokens), about 25 s; the old client stalled longer and longer.
  const end = Date.now() + 60000;
  while (calls.length < 11 && Date.now() < end) await sleep(100);
  await w.stop();
  // The pauses while the writer wrote, up to its end (a stall at the end counts too).
  const stopped = Date.now();
  const gaps = longest([...at.slice(1).filter((t) => t <= stopped), stopped]);
  const caught = await until("the last write", () => r.has("exp/a", w.n), 35000).catch(() => false);
  f.close();
  await f.done;
  assert.ok(
    gaps[0] <= GAP_MS,
    `no pause past one backoff step (${GAP_MS} ms): the longest were ${gaps} ms (the writer's: ${longest(w.at)} ms), ` +
      `${calls.length} tokens at ${calls.map((t) => t - calls[0])}`,
  );
  assert.ok(caught, "the page got the last write");
  assert.ok(calls.length >= 11, "ten expiries: " + calls.length + " tokens");
  assert.deepEqual(r.older, []);
  assert.deepEqual(r.errors, [], "an expiry is not an error");
});

test("a token function whose tokens are refused (another key): error 401, not fatal, retries spaced by the capped backoff", async () => {
  let tokens;
  const s = await server('[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\nleeway_s = 0\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  await s.ingest("bad/a", 1, {}, { Authorization: "Bearer " + tokens.mint(["*"], 600) });
  const p = await proxy(s.port, "pass");
  let calls = 0;
  const pb = new Client({
    url: p.url,
    backoffMs: 100,
    maxBackoffMs: 400,
    token: () => {
      calls++;
      return tokens.mint(["bad/*"], 600, "not-the-key-the-server-has-32-bytes");
    },
  });
  const r = recorder();
  const f = pb.follow("bad/a", r.handlers);
  await sleep(4000);
  f.close();
  await f.done;
  const attempts = p.requests.filter((q) => q.headers.accept === "text/event-stream").map((q) => q.at);
  assert.ok(r.errors.length >= 3, "the refusals were reported: " + JSON.stringify(r.errors));
  for (const e of r.errors) assert.deepEqual([e.status, e.fatal], [401, false], JSON.stringify(e));
  // The first 401 is mended at once, quietly; each later one is reported.
  assert.ok(Math.abs(r.errors.length - (attempts.length - 1)) <= 1, `${r.errors.length} errors for ${attempts.length} attempts`);
  assert.ok(attempts.length > 1, "kept retrying: " + attempts.length);
  assert.ok(Math.abs(calls - attempts.length) <= 1, `a fresh token for each attempt: ${calls} for ${attempts.length}`);
  const gaps = attempts.slice(1).map((t, i) => t - attempts[i]);
  assert.ok(Math.max(...gaps) <= 400 + 300, "at the capped backoff: " + gaps);
  // Full jitter: uniform in [0, 400) once capped, 200 ms on average: about 20 in 4 s.
  assert.ok(attempts.length <= 60, "waited a backoff between tries: " + attempts.length + " in 4 s");
  assert.deepEqual(r.updates, []);
});

test("tokens in the query (auth.jwt.query_param) and in a cookie", async () => {
  let tokens;
  const s = await server('[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\nquery_param = true\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  await s.ingest("q/a", 7, {}, { Authorization: "Bearer " + tokens.mint(["*"], 600) });
  const q = new Client({ url: s.url, token: tokens.mint(["q/*"], 600), tokenIn: "query" });
  assert.equal((await q.read("q/a")).payload.v, 7);
  const r = recorder();
  const f = q.follow("q/a", r.handlers);
  await until("streamed with ?access_token=", () => r.has("q/a", 7));
  f.close();
  // A cookie: the runtime's cookie jar (a browser's) is stood in for by a fetch
  // that sends the cookie the token function "set".
  let cookie = "";
  const c = new Client({
    url: s.url,
    tokenIn: "cookie",
    token: () => {
      cookie = "pollbox_token=" + tokens.mint(["q/*"], 600);
    },
    fetch: (url, init) => {
      assert.equal(init.credentials, "include");
      assert.equal(init.headers.Authorization, undefined);
      return fetch(url, { ...init, headers: { ...init.headers, Cookie: cookie } });
    },
  });
  assert.equal((await c.read("q/a")).payload.v, 7);
  await f.done;
});

test("posts: one message, typed failures, NDJSON batches with counts and errors", async () => {
  const s = await server('[auth]\ningest_tokens = ["w-1"]\n');
  const pb = new Client({ url: s.url, token: "w-1" });
  const one = await pb.post("p-1", { value: 5, player: "p-7" });
  assert.equal(one.ok, true);
  assert.equal(one.payload.v, 5);
  assert.equal(one.payload.by, "p-7");
  const bad = await pb.post("p-1", { value: "x" });
  assert.deepEqual(bad, { ok: false, status: 422, error: "field v: expected an integer (i64)", maybeApplied: false, retryAfterMs: undefined });
  const batch = await pb.postBatch([{ key: "p-2", value: 1 }, { value: 2 }, { key: "p-2", value: 3 }]);
  assert.deepEqual(batch, { ok: true, status: 200, accepted: 2, rejected: 1, errors: [{ i: 1, error: "missing key: no member named key" }] });
  assert.equal((await s.box("p-2")).sum, 4);
  const anon = await new Client(s.url).post("p-1", { value: 1 });
  assert.equal(anon.status, 401);
  assert.equal(anon.maybeApplied, false);
});

test("posts are not sent again when they may have reached the server, unless asked", async () => {
  const s = await server();
  const p = await proxy(s.port, "drop");
  const pb = new Client({ url: p.url, backoffMs: 50 });
  const r = await pb.post("nr", { value: 1 });
  assert.equal(r.ok, false);
  assert.equal(r.status, 0);
  assert.equal(r.maybeApplied, true);
  assert.equal((await s.box("nr")).n, 1, "applied once, not sent again");
  const b = await pb.postBatch([{ key: "nr", value: 1 }]);
  assert.equal(b.maybeApplied, true);
  assert.equal((await s.box("nr")).n, 2);
  const again = await pb.post("nr", { value: 1 }, { retry: "always", attempts: 3 });
  assert.equal(again.ok, false);
  assert.equal((await s.box("nr")).n, 5, "retry: always sent it 3 times (at-least-once)");
});

test("posts that cannot have reached the server are sent again: connection refused, 429", async () => {
  const port = await freePort();
  const pb = new Client({ url: `http://127.0.0.1:${port}`, backoffMs: 200 });
  const sent = pb.post("cr", { value: 1 });
  await sleep(100);
  const s = await server("", { port });
  const r = await sent;
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal((await s.box("cr")).n, 1);
  const never = await new Client({ url: `http://127.0.0.1:${await freePort()}` }).post("cr", { value: 1 }, { retry: "never" });
  assert.deepEqual([never.ok, never.maybeApplied], [false, false]);
  const limited = await server("[limits]\nrequests_per_s_per_ip = 1\nrequests_burst_per_ip = 1\n");
  const lp = new Client(limited.url);
  const t0 = Date.now();
  assert.equal((await lp.post("rl", { value: 1 })).ok, true);
  assert.equal((await lp.post("rl", { value: 2 })).ok, true, "the 429 was retried");
  assert.ok(Date.now() - t0 >= 900, "after Retry-After");
  await sleep(1100); // this test's own poll takes from the same bucket
  assert.equal((await limited.box("rl")).n, 2);
});

test("an AbortSignal stops following: no request and no update after it", async () => {
  const s = await server();
  const p = await proxy(s.port, "pass");
  const ctl = new AbortController();
  const r = recorder();
  await s.ingest("ab", 1);
  const f = new Client({ url: p.url, backoffMs: 50 }).follow({ keys: ["ab", "ab-2"] }, r.handlers, { signal: ctl.signal });
  await until("the box", () => r.has("ab", 1));
  ctl.abort();
  await f.done;
  const seen = p.requests.length;
  await s.ingest("ab", 2);
  await sleep(500);
  assert.equal(p.requests.length, seen);
  await until("the stream closed", () => p.requests.every((q) => q.closed), 3000);
  assert.deepEqual(r.updates.map((u) => u.v), [1]);
});

/** The boxes of a room as the server's pages give them, by key. */
async function roomOf(s, prefix) {
  const room = {};
  let next = null;
  do {
    const cursor = next === null ? "" : "&cursor=" + next;
    const r = await fetch(`${s.url}/v1/boxes?prefix=${encodeURIComponent(prefix)}&limit=1000${cursor}`);
    assert.equal(r.status, 200);
    const page = await r.json();
    for (const b of page.boxes) room[b.k] = b;
    next = page.next;
  } while (next !== null);
  return room;
}

/** Create boxes `keys` (`{"value": v}`) with one NDJSON batch. */
async function batch(s, keys, v) {
  const body = keys.map((key) => JSON.stringify({ key, value: v })).join("\n") + "\n";
  const r = await fetch(`${s.url}/v1/ingest`, { method: "POST", headers: { "Content-Type": "application/x-ndjson" }, body });
  assert.equal(r.status, 200, await r.text());
}

/** Until the page holds exactly the server's room: every box at its version. */
async function converged(r, s, prefix, what) {
  let room;
  await until(what, async () => {
    room = await roomOf(s, prefix);
    const held = Object.keys(r.last).filter((k) => k.startsWith(prefix)).sort();
    return held.join() === Object.keys(room).sort().join() && held.every((k) => r.last[k].ver === room[k].ver);
  });
  assert.deepEqual(r.last, room, what);
  return room;
}

const others = ["room-18/a", "room-1/a", "room-17", "room-17x/a", "room-170/a"];

test("follow a room over a stream: its boxes, later ones, updates, deletions, none of other rooms", async () => {
  const s = await server();
  // More boxes than one step of the server's listing (64).
  const before = Array.from({ length: 150 }, (_, i) => `room-17/k-${String(i).padStart(3, "0")}`);
  await batch(s, [...before, "room-17/sub/a", ...others], 1);
  const r = recorder();
  const f = new Client({ url: s.url, backoffMs: 100 }).follow({ prefix: "room-17/" }, r.handlers);
  await converged(r, s, "room-17/", "the room's boxes");
  assert.equal(r.updates.length, 151);
  await s.ingest("room-17/new", 1);
  await s.ingest("room-17/k-000", 2);
  assert.equal(await s.remove("room-17/k-001"), 204);
  for (const k of others) await s.ingest(k, 2);
  await until("created, updated, deleted", () => r.has("room-17/new", 1) && r.has("room-17/k-000", 2) && r.deleted.includes("room-17/k-001"));
  await s.ingest("room-17/k-001", 3);
  await until("created again", () => r.has("room-17/k-001", 3));
  await converged(r, s, "room-17/", "the room after the changes");
  f.close();
  await f.done;
  for (const k of others) assert.equal(r.updates.find((u) => u.k === k), undefined, k + " is not in the room");
  assert.deepEqual(r.deleted, ["room-17/k-001"]);
  assert.deepEqual(r.modes, ["stream"]);
  assert.deepEqual(r.older, []);
  assert.deepEqual(r.errors, []);
});

test("a room through kill -9 and a restart without a snapshot: the boxes not created again are dropped at the relisting", async () => {
  const s = await server();
  const keys = Array.from({ length: 80 }, (_, i) => `room-17/k-${String(i).padStart(2, "0")}`);
  await batch(s, [...keys, ...others], 1);
  const r = recorder();
  const f = new Client({ url: s.url, backoffMs: 100, maxBackoffMs: 400 }).follow({ prefix: "room-17/" }, r.handlers);
  await converged(r, s, "room-17/", "the room");
  await s.ingest("room-17/k-00", 2);
  await until("the update", () => r.has("room-17/k-00", 2));
  await s.stop("SIGKILL");
  await sleep(500);
  await s.start();
  // The restarted server has no boxes: some are created again (past every
  // version served before), the rest never exist in the new process, so no
  // `event: deleted` can name them: only the listing's `event: synced` can.
  const again = keys.filter((_, i) => i % 3 === 0);
  await batch(s, again, 5);
  await s.ingest("room-17/late", 1);
  await batch(s, others, 5);
  const room = await converged(r, s, "room-17/", "the room after the restart");
  f.close();
  await f.done;
  assert.deepEqual(Object.keys(room).sort(), [...again, "room-17/late"].sort());
  assert.deepEqual(r.deleted.sort(), keys.filter((k) => !again.includes(k)).sort(), "each box not created again, reported once");
  for (const k of again) assert.equal(r.last[k].v, 5);
  for (const k of others) assert.equal(r.updates.find((u) => u.k === k), undefined, k);
  assert.ok(r.errors.some((e) => e.status === 0), "the outage was seen");
  assert.deepEqual(r.older, []);
});

test("a room behind a buffering proxy: the stream does not flow, the room's pages do (and long-polls where the server has them)", async () => {
  const s = await server();
  const p = await proxy(s.port, "buffer");
  await batch(s, ["room-17/a", "room-17/b", "room-17/c", ...others], 1);
  const r = recorder();
  const pb = new Client({ url: p.url, firstByteMs: 300, streamRetryMs: 600000, waitMs: 500, backoffMs: 100 });
  const f = pb.follow({ prefix: "room-17/" }, r.handlers);
  await converged(r, s, "room-17/", "the room by long-poll");
  assert.deepEqual(r.modes, ["long-poll"]);
  await s.ingest("room-17/a", 2);
  await s.ingest("room-17/d", 1);
  assert.equal(await s.remove("room-17/b"), 204);
  await until("updated, created, deleted", () => r.has("room-17/a", 2) && r.has("room-17/d", 1) && r.deleted.includes("room-17/b"));
  await s.stop("SIGKILL");
  await s.start();
  await batch(s, ["room-17/a", "room-17/e"], 7);
  await converged(r, s, "room-17/", "the room after a restart");
  f.close();
  await f.done;
  // A relisting that reached the restarted server before the batch found the
  // room empty: `a` was gone then, and came back (converged holds it at 7).
  assert.deepEqual(r.deleted.filter((k) => k !== "room-17/a").sort(), ["room-17/b", "room-17/c", "room-17/d"]);
  const polls = p.requests.filter((q) => q.headers.accept !== "text/event-stream");
  assert.match(polls[0].url, /^\/v1\/boxes\?prefix=room-17%2F&limit=1000$/, "the first time, a walk of the room's pages");
  assert.deepEqual(r.older, []);
  assert.deepEqual(r.modes, ["long-poll"]);
});

test("a room by the long-poll form (after=W): waits, resumes from the last answer's after, reset after a restart", async (t) => {
  const s = await server();
  const page = await (await fetch(`${s.url}/v1/boxes?prefix=room-17%2F`)).json();
  const form = await fetch(`${s.url}/v1/boxes?prefix=room-17%2F&after=${encodeURIComponent(page.after ?? "0")}&wait_ms=10`);
  const answer = form.status === 200 ? await form.json() : null;
  if (page.after === undefined || form.status === 400 || (answer && answer.after === undefined)) {
    t.skip(
      `this server has no long-poll form of a room (a page has no "after"; ?prefix=&after=&wait_ms= answered ` +
        `${form.status}${answer ? " " + JSON.stringify(answer).slice(0, 60) : ""}): the client walks the room's pages every waitMs instead, ` +
        "tested above; this test is written to the rooms contract",
    );
    return;
  }
  const p = await proxy(s.port, "pass");
  await batch(s, ["room-17/a", "room-17/b", ...others], 1);
  const r = recorder();
  const pb = new Client({ url: p.url, waitMs: 1500, backoffMs: 100 });
  const f = pb.follow({ prefix: "room-17/" }, r.handlers, { transport: "long-poll" });
  await converged(r, s, "room-17/", "the room");
  const quiet = p.requests.length;
  await sleep(2000);
  assert.ok(p.requests.length - quiet <= 2, "a quiet room: long-polls wait (" + (p.requests.length - quiet) + " requests in 2 s)");
  await s.ingest("room-17/a", 2);
  assert.equal(await s.remove("room-17/b"), 204);
  await until("updated and deleted", () => r.has("room-17/a", 2) && r.deleted.includes("room-17/b"));
  await s.stop("SIGKILL");
  await s.start();
  await batch(s, ["room-17/c"], 3);
  await converged(r, s, "room-17/", "the room after a restart (reset)");
  f.close();
  await f.done;
  assert.deepEqual(r.deleted.sort(), ["room-17/a", "room-17/b"]);
  const urls = p.requests.map((q) => q.url);
  assert.match(urls[0], /&limit=1000$/);
  assert.ok(urls.slice(1).some((u) => /&after=[^&]+&wait_ms=1500/.test(u)), urls.join("\n"));
  assert.deepEqual(r.older, []);
});

test("a room's reads need a token covering the whole prefix: 403 ends the following", async () => {
  let tokens;
  const s = await server('[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  await s.ingest("room-17/a", 1, {}, { Authorization: "Bearer " + tokens.mint(["*"], 600) });
  const ok = recorder();
  const f = new Client({ url: s.url, token: tokens.mint(["room-17/*"], 600) }).follow({ prefix: "room-17/" }, ok.handlers);
  await until("the room with room-17/*", () => ok.has("room-17/a", 1));
  f.close();
  for (const transport of ["stream", "long-poll"]) {
    const no = recorder();
    const g = new Client({ url: s.url, token: tokens.mint(["room-17/a"], 600) }).follow({ prefix: "room-17/" }, no.handlers, { transport });
    await g.done;
    assert.deepEqual(no.errors.map((e) => [e.status, e.fatal]), [[403, true]], transport);
    assert.equal(no.errors[0].message, "forbidden");
  }
  await f.done;
});

/** What client.presence handed over: each state, joins, leaves (with when),
 * info updates, count-only states, errors. */
function watcher() {
  const w = { states: [], joins: [], leaves: [], updates: [], counts: [], errors: [], modes: [] };
  w.handlers = {
    members: (list, count, ver) => w.states.push({ ids: list.map((m) => m.id), list, count, ver }),
    join: (m) => w.joins.push(m),
    leave: (m) => w.leaves.push({ id: m.id, at: Date.now() }),
    update: (m, b) => w.updates.push([m, b]),
    count: (n) => w.counts.push(n),
    mode: (m) => w.modes.push(m),
    error: (e, fatal) => w.errors.push({ status: e.status, message: e.message, fatal }),
  };
  w.now = () => w.states.at(-1)?.ids.join(",");
  return w;
}

const GRACE = '[presence]\nleave_grace_ms = 200\n';

test("presence: two members join (the presence box's stream, the room's stream), a watcher sees both; one closes and leaves after the grace", async () => {
  const s = await server(GRACE);
  const pb = new Client({ url: s.url, backoffMs: 100 });
  const w = watcher();
  const watch = pb.presence("room-17/", w.handlers);
  await until("the empty room", () => w.now() === "");
  const alice = pb.presence("room-17/", {}, { member: "alice", info: { name: "Alice & co" } });
  const bob = pb.follow({ prefix: "room-17/" }, { update() {} }, { member: "bob" });
  await until("both joined", () => w.now() === "alice,bob");
  assert.deepEqual(w.joins.map((m) => m.id).sort(), ["alice", "bob"]);
  assert.deepEqual(w.joins.find((m) => m.id === "alice").info, { name: "Alice & co" });
  const read = await pb.read("room-17/~presence");
  assert.deepEqual(read.payload.members, [{ id: "alice", info: { name: "Alice & co" } }, { id: "bob" }]);
  // Other rooms see no one.
  assert.deepEqual((await pb.read("room-18/~presence")).payload.members, []);

  const closed = Date.now();
  bob.close();
  await bob.done;
  await until("bob left", () => w.leaves.length === 1);
  assert.equal(w.leaves[0].id, "bob");
  const after = w.leaves[0].at - closed;
  assert.ok(after >= 150 && after < 3000, "bob left " + after + " ms after closing (grace 200 ms)");
  assert.equal(w.now(), "alice");

  alice.close();
  await alice.done;
  await until("alice left", () => w.now() === "");
  watch.close();
  await watch.done;
  assert.deepEqual(w.leaves.map((l) => l.id), ["bob", "alice"]);
  assert.deepEqual(w.updates, []);
  assert.deepEqual(w.errors, []);
  assert.deepEqual(w.modes, ["stream"]);
});

test("presence by long-poll: members stay present across their long-polls, a watcher by long-poll sees joins and leaves; two tabs are one member", async () => {
  const s = await server(GRACE);
  const pb = new Client({ url: s.url, backoffMs: 100, waitMs: 300 });
  const lp = { transport: "long-poll" };
  const w = watcher();
  const watch = pb.presence("room-17/", w.handlers, lp);
  await until("the empty room", () => w.now() === "");
  const carol = pb.presence("room-17/", {}, { ...lp, member: "carol" });
  const dave = pb.follow({ prefix: "room-17/" }, { update() {} }, { ...lp, member: "dave" });
  const tab1 = pb.follow("room-17/~presence", { update() {} }, { member: "erin", info: { tab: 1 } });
  await until("three joined", () => w.now() === "carol,dave,erin");
  const tab2 = pb.follow("room-17/~presence", { update() {} }, { member: "erin", info: { tab: 2 } });
  await until("erin's newer info", () => w.updates.length === 1);
  assert.deepEqual(w.updates[0].map((m) => m.info), [{ tab: 2 }, { tab: 1 }]);
  // Several long-polls of 300 ms each, past the grace of 200 ms: no leave.
  await sleep(1500);
  tab1.close();
  await sleep(600);
  assert.deepEqual(w.leaves, [], "no leave while following, nor for a member with another tab open");
  assert.equal(w.now(), "carol,dave,erin");
  for (const f of [carol, dave, tab2]) f.close();
  await until("all left", () => w.now() === "");
  watch.close();
  await Promise.all([watch.done, carol.done, dave.done, tab1.done, tab2.done]);
  assert.deepEqual(w.leaves.map((l) => l.id).sort(), ["carol", "dave", "erin"]);
  assert.deepEqual(w.joins.map((m) => m.id).sort(), ["carol", "dave", "erin"]);
  assert.deepEqual(w.errors, []);
  assert.deepEqual(w.modes, ["long-poll"]);
});

test("presence pages and count-only states past max_listed", async () => {
  const s = await server(GRACE + "max_listed = 2\ncount_interval_ms = 100\n");
  const pb = new Client({ url: s.url, backoffMs: 100 });
  const w = watcher();
  const watch = pb.presence("room-17/", w.handlers);
  const ids = ["m1", "m2", "m3", "m4", "m5"];
  const members = [];
  for (const id of ids.slice(0, 2)) members.push(pb.presence("room-17/", {}, { member: id }));
  await until("two listed", () => w.now() === "m1,m2");
  const joined = w.joins.length;
  for (const id of ids.slice(2)) members.push(pb.presence("room-17/", {}, { member: id }));
  await until("the count alone", () => w.counts.at(-1) === 5);
  const pages = [];
  for (let cursor; ; ) {
    const p = await pb.presencePage("room-17/", { limit: 2, cursor });
    assert.equal(p.count, 5);
    pages.push(p.members.map((m) => m.id));
    if (p.next === null) break;
    cursor = p.next;
  }
  assert.deepEqual(pages, [["m1", "m2"], ["m3", "m4"], ["m5"]]);
  for (const f of members.slice(1, 4)) f.close();
  await until("listed again", () => w.now() === "m1,m5");
  assert.deepEqual(w.leaves.map((l) => l.id).sort(), ["m2"], "compared with the last listed state");
  assert.deepEqual(w.joins.slice(joined).map((m) => m.id), ["m5"]);
  for (const f of [watch, members[0], members[4]]) f.close();
  await Promise.all([watch.done, ...members.map((f) => f.done)]);
  assert.deepEqual(w.errors, []);
});

test("presence with tokens: the member is the token's sub, its info the token's pollbox.info; another member= is 403 and ends the follow", async () => {
  let tokens;
  const s = await server(GRACE + '[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "$DIR/jwks.json"\n', {
    before: (dir) => (tokens = new Tokens(dir)),
  });
  const w = watcher();
  const watch = new Client({ url: s.url, token: tokens.mint(["room-17/*"], 600) }).presence("room-17/", w.handlers);
  await until("the empty room", () => w.now() === "");
  const alice = new Client({ url: s.url, token: () => tokens.mint(["room-17/*"], 600, undefined, { sub: "alice", info: { name: "A" } }) });
  const a = alice.follow({ prefix: "room-17/" }, { update() {} }, { member: "alice" });
  await until("alice joined", () => w.now() === "alice");
  assert.deepEqual(w.joins, [{ id: "alice", info: { name: "A" } }]);
  const m = recorder();
  await alice.presence("room-17/", m.handlers, { member: "mallory" }).done;
  assert.deepEqual(m.errors.map((e) => [e.status, e.message, e.fatal]), [[403, "member is not the token's sub", true]]);
  a.close();
  await until("alice left", () => w.now() === "");
  watch.close();
  await Promise.all([watch.done, a.done]);
  assert.deepEqual(w.errors, []);
});
