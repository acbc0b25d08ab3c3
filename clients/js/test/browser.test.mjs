// The page's view, in headless Chromium (needs Debian's `chromium`; run with
// `npm run test:browser`): a page on its own origin follows boxes with the
// client through a kill -9 and a restart of the server, and through a
// buffering proxy that forces long-polls. Each time the page ends with the
// server's exact state and never showed a version older than one it showed.
// What it is not: the cluster's rolling restart (cluster.test.mjs, which
// needs a Kafka broker and HAProxy).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Pollbox, Proxy, freePort, sleep } from "./harness.mjs";
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
