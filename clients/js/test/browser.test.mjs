// The page's view, in headless Chromium (needs Debian's `chromium`; run with
// `npm run test:browser`): a page on its own origin follows boxes with the
// client through a kill -9 and a restart of the server, and through a
// buffering proxy that forces long-polls; a page follows a room (a prefix)
// through a kill -9 and a restart that lost its boxes; and a page whose
// tokens end every 1-2 s follows a box written 20 times a second through ten
// expiries (tokens in a header: a fetch stream; in the query: EventSource).
// Each time the page ends with the server's exact state and never showed a
// version older than one it showed.
// What it is not: the cluster's rolling restart (cluster.test.mjs, which
// needs a Kafka broker and HAProxy).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { GAP_MS, Pollbox, Proxy, Tokens, freePort, longest, sleep, writer } from "./harness.mjs";
import { Page } from "./page.mjs";

const cleanup = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});

export const keys = ["b-1", "b-2", "room 3/a,b ü"];

/** The page's last payloads are the server's, box by box, and it never
 * showed a version older than one it showed. */
export async function sameAsServer(res, s) {
  for (const k of keys) assert.deepEqual(res.last[k] ?? null, await s.box(k), k);
  assert.deepEqual(res.older, [], "never a version older than one shown");
}

test("a page follows boxes through kill -9 and a restart of the server", async () => {
  const port = await freePort();
  const s = await Pollbox.start(
    `[http]\ncors_origins = ["http://127.0.0.1:${port}"]\n[snapshot]\npath = "$DIR/boxes.snap"\ninterval_s = 1\n`,
  );
  cleanup.push(() => s.close());
  const p = await Page.open(port, s.url, keys, { backoffMs: 200, maxBackoffMs: 1000 });
  cleanup.push(() => p.close());
  for (const [i, k] of keys.entries()) await s.ingest(k, i + 1);
  p.launch();
  await p.waitFor(keys.map((k, i) => `seen=${k}:${i + 1}`));
  await s.ingest("b-1", 10);
  await p.waitFor(["seen=b-1:10"]);
  await sleep(1500); // a snapshot has it
  await s.stop("SIGKILL");
  await sleep(1000);
  await s.start();
  await s.ingest("b-1", 11);
  await s.ingest("b-2", 12);
  assert.equal(await s.remove("room 3/a,b ü"), 204);
  await p.waitFor(["seen=b-1:11", "seen=b-2:12", "deleted=room 3/a,b ü"]);
  const res = await p.finish();
  await sameAsServer(res, s);
  assert.ok(res.errors.some((e) => e.status === 0), "the page saw the outage");
  assert.deepEqual(res.modes, ["stream"]);
});

test("a page behind a buffering proxy falls back to long-polls and sees every update", async () => {
  const port = await freePort();
  const s = await Pollbox.start(`[http]\ncors_origins = ["http://127.0.0.1:${port}"]\n`);
  cleanup.push(() => s.close());
  const proxy = await Proxy.start(s.port, "buffer");
  cleanup.push(() => proxy.close());
  const p = await Page.open(port, proxy.url, keys, { firstByteMs: 1000, waitMs: 2000, streamRetryMs: 600000 });
  cleanup.push(() => p.close());
  for (const [i, k] of keys.entries()) await s.ingest(k, i + 1);
  p.launch();
  await p.waitFor(["mode=long-poll", ...keys.map((k, i) => `seen=${k}:${i + 1}`)]);
  for (let v = 20; v < 25; v++) await s.ingest("b-2", v);
  await s.remove("b-1");
  await p.waitFor(["seen=b-2:24", "deleted=b-1"]);
  const res = await p.finish();
  await sameAsServer(res, s);
  assert.deepEqual(res.modes, ["long-poll"]);
  assert.ok(proxy.requests.some((q) => q.method === "OPTIONS"), "the If-None-Match preflight went through the proxy");
});

/** The boxes of a room as the server's pages give them, by key. */
async function roomOf(s, prefix) {
  const room = {};
  let next = null;
  do {
    const cursor = next === null ? "" : "&cursor=" + next;
    const page = await (await fetch(`${s.url}/v1/boxes?prefix=${encodeURIComponent(prefix)}&limit=1000${cursor}`)).json();
    for (const b of page.boxes) room[b.k] = b;
    next = page.next;
  } while (next !== null);
  return room;
}

test("a page follows a room through creates, updates, deletes, kill -9 and a restart that lost its boxes", async () => {
  const port = await freePort();
  // No snapshot: the restarted server starts empty.
  const s = await Pollbox.start(`[http]\ncors_origins = ["http://127.0.0.1:${port}"]\n`);
  cleanup.push(() => s.close());
  const p = await Page.open(port, s.url, { prefix: "room-17/" }, { backoffMs: 200, maxBackoffMs: 1000 });
  cleanup.push(() => p.close());
  for (const k of ["room-17/a", "room-17/b", "room-17/c ü", "room-18/a", "room-17"]) await s.ingest(k, 1);
  p.launch();
  await p.waitFor(["mode=stream", "seen=room-17/a:1", "seen=room-17/b:1", "seen=room-17/c ü:1"]);
  await s.ingest("room-17/d", 1);
  await s.ingest("room-17/a", 2);
  assert.equal(await s.remove("room-17/b"), 204);
  await s.ingest("room-18/a", 2);
  await p.waitFor(["seen=room-17/d:1", "seen=room-17/a:2", "deleted=room-17/b"]);
  await s.stop("SIGKILL");
  await sleep(1000);
  await s.start();
  // a and e exist in the new process; c and d do not, and no event names
  // them: the page drops them when the room's listing ends.
  await s.ingest("room-17/a", 3);
  await s.ingest("room-17/e", 1);
  await p.waitFor(["seen=room-17/a:3", "seen=room-17/e:1", "deleted=room-17/c ü", "deleted=room-17/d"]);
  const res = await p.finish();
  assert.deepEqual(res.last, await roomOf(s, "room-17/"), "the server's room, box by box");
  assert.deepEqual(Object.keys(res.last).sort(), ["room-17/a", "room-17/e"]);
  assert.deepEqual(res.deleted, ["room-17/b", "room-17/c ü", "room-17/d"]);
  assert.deepEqual(res.older, [], "never a version older than one shown");
  assert.ok(res.errors.some((e) => e.status === 0), "the page saw the outage");
  assert.deepEqual(res.modes, ["stream"]);
});

for (const [tokenIn, stream] of [["header", "a fetch stream"], ["query", "EventSource"]]) {
  test(`a page with tokens of 1-2 s in the ${tokenIn} (${stream}) follows a box written 20 times a second through ten expiries without a stall`, async () => {
    const port = await freePort();
    let tokens;
    const s = await Pollbox.start(
      `[http]\ncors_origins = ["http://127.0.0.1:${port}"]\n[auth]\nread = "token"\n` +
        `[auth.jwt]\nkeys_file = "$DIR/jwks.json"\nleeway_s = 0\nquery_param = true\n`,
      { before: (dir) => (tokens = new Tokens(dir)) },
    );
    cleanup.push(() => s.close());
    const auth = { Authorization: "Bearer " + tokens.mint(["*"], 600) };
    await s.ingest("exp/a", 0, {}, auth);
    const calls = [];
    // The client's default backoff (backoffMs 1000, maxBackoffMs 30000).
    const p = await Page.open(port, s.url, ["exp/a"], { tokenIn, tokenUrl: "/token" }, {
      "/token": () => {
        calls.push(Date.now());
        return tokens.mint(["exp/*"], 2);
      },
    });
    cleanup.push(() => p.close());
    p.launch();
    await p.waitFor(["seen=exp/a:0"]);
    const w = writer(s, "exp/a", auth);
    const end = Date.now() + 60000;
    while (calls.length < 11 && Date.now() < end) await sleep(100);
    await w.stop();
    const stopped = Date.now();
    const caught = await p.waitFor(["seen=exp/a:" + w.n], 35000).then(() => true, () => false);
    const res = await p.finish();
    // The pauses while the writer wrote, up to its end (a stall at the end counts too).
    const gaps = longest([...res.times.slice(1).filter((t) => t <= stopped), stopped]);
    assert.ok(
      gaps[0] <= GAP_MS,
      `no pause past one backoff step (${GAP_MS} ms): the longest were ${gaps} ms (the writer's: ${longest(w.at)} ms), ` +
        `${calls.length} tokens at ${calls.map((t) => t - calls[0])}`,
    );
    assert.ok(caught, "the page got the last write");
    assert.ok(calls.length >= 11, "ten expiries: " + calls.length + " tokens");
    assert.deepEqual(res.last["exp/a"], await s.box("exp/a", auth), "the server's box");
    assert.deepEqual(res.older, [], "never a version older than one shown");
    assert.deepEqual(res.errors, [], "an expiry is not an error");
    assert.deepEqual(res.modes, ["stream"]);
  });
}
