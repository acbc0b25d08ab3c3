// The page's view of a log cluster (needs a Kafka broker from scripts/kafka,
// HAProxy and Chromium; run with `npm run test:cluster`): two nodes of one
// Kafka topic behind HAProxy (deploy/haproxy/haproxy-replicas.cfg.tmpl), a
// page that follows boxes through HAProxy with the client, and a rolling
// restart of both nodes. The page ends with the cluster's exact state and
// never showed a version older than one it showed.
// What it is not: a durability test of the log (crates/pollbox/tests/log_crash.rs).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import { Pollbox, freePort, repo, until } from "./harness.mjs";
import { Page } from "./page.mjs";

const cleanup = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});

const keys = ["c-1", "c-2", "room 3/a,b ü"];

/** One broker (start.sh, stopped with this process), a topic of 2 partitions. */
function kafka() {
  const out = execFileSync(join(repo, "scripts/kafka/start.sh"), ["--partitions", "2", "--watch-pid", String(process.pid)], {
    encoding: "utf8",
  });
  const field = (n) => out.split("\n").find((l) => l.startsWith(n + "="))?.slice(n.length + 1);
  const broker = { bootstrap: field("BOOTSTRAP"), dir: field("DIR") };
  cleanup.push(() => execFileSync(join(repo, "scripts/kafka/stop.sh"), [broker.dir], { stdio: "ignore" }));
  execFileSync(join(repo, "scripts/kafka/topic.sh"), [broker.bootstrap, "create", "pollbox", "2"], { stdio: "ignore" });
  return broker;
}

async function ready(url) {
  await until("ready: " + url, async () => (await fetch(url + "/readyz").catch(() => null))?.status === 200, 60000);
}

test("a page follows boxes through a rolling restart of two nodes of a log behind HAProxy", async () => {
  const broker = kafka();
  const pagePort = await freePort();
  const toml = (name) =>
    `[server]\ntrusted_proxies = ["127.0.0.1"]\n[http]\ncors_origins = ["http://127.0.0.1:${pagePort}"]\n` +
    `[snapshot]\npath = "$DIR/${name}.snap"\ninterval_s = 1\n[log]\nbrokers = "${broker.bootstrap}"\nallow_unsafe_topic = true\n`;
  const nodes = [await Pollbox.start(toml("a")), await Pollbox.start(toml("b"))];
  for (const n of nodes) {
    cleanup.push(() => n.close());
    await ready(n.url);
  }
  const front = await freePort();
  const haproxy = spawn("haproxy", ["-db", "-f", join(repo, "deploy/haproxy/haproxy-replicas.cfg.tmpl")], {
    env: { ...process.env, FRONT_PORT: String(front), NODE1: `127.0.0.1:${nodes[0].port}`, NODE2: `127.0.0.1:${nodes[1].port}` },
    stdio: "ignore",
  });
  cleanup.push(() => haproxy.kill("SIGKILL"));
  const frontUrl = `http://127.0.0.1:${front}`;
  await until("haproxy has a node", async () => (await fetch(frontUrl + "/readyz").catch(() => null))?.status === 200, 30000);

  for (const [i, k] of keys.entries()) await nodes[0].ingest(k, i + 1);
  const p = await Page.open(pagePort, frontUrl, keys, { backoffMs: 200, maxBackoffMs: 2000 });
  cleanup.push(() => p.close());
  p.launch();
  await p.waitFor(keys.map((k, i) => `seen=${k}:${i + 1}`));
  // Rolling restart: each node in turn stops (SIGTERM), the other takes the
  // writes, the node comes back and catches up with the log.
  for (const [n, other, v] of [[0, 1, 10], [1, 0, 20]]) {
    await nodes[n].stop("SIGTERM");
    await nodes[other].ingest("c-1", v);
    await nodes[other].ingest("c-2", v + 1);
    await p.waitFor([`seen=c-1:${v}`, `seen=c-2:${v + 1}`]);
    await nodes[n].start();
    await ready(nodes[n].url);
    await nodes[n].ingest("c-1", v + 2);
    await p.waitFor([`seen=c-1:${v + 2}`]);
  }
  assert.equal(await nodes[1].remove("room 3/a,b ü"), 204);
  await p.waitFor(["deleted=room 3/a,b ü"]);
  const res = await p.finish();
  for (const n of nodes) {
    for (const k of keys) assert.deepEqual(res.last[k] ?? null, await n.box(k), `${k} on ${n.url}`);
  }
  assert.deepEqual(res.older, [], "never a version older than one shown");
  assert.deepEqual(res.errors.filter((e) => e.fatal), []);
});

