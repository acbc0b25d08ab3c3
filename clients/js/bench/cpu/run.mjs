// The page's CPU per update delivered: the client against a bare EventSource
// handler, in headless Chromium, at 1,000 updates/s. A pollbox (release
// binary, POLLBOX_BIN as in the tests) takes 1,000 POSTs a second into ten
// boxes (one POST into each every 10 ms, pipelined on one connection: each box
// is coalesced on its own, so each POST is an event); a page on its own
// origin follows the ten boxes on one stream, either with
// `new EventSource(url + "/v1/boxes?keys=...")` and
// `onmessage = (e) => take(JSON.parse(e.data))`, or with the client's
// `follow({ keys }, { update: take })` (an EventSource inside), and, for the
// record, the client told to read the stream with fetch (`eventSource:
// false`: what a page with a header token gets). For each run: the updates the page got
// (counted in the page, its window timed with performance.now()) and the CPU
// time of Chromium's renderer processes over that window (/proc: the page's
// main thread and its workers), and of all of Chromium's processes. Runs
// alternate, bare, client, client-fetch, ROUNDS times.
// Usage: node bench/cpu/run.mjs [seconds per run] [rounds]
// What it is not: a test (nothing here fails on a number).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Pollbox, freePort, sleep, until } from "../../test/harness.mjs";

const SECONDS = Number(process.argv[2] ?? 10);
const ROUNDS = Number(process.argv[3] ?? 3);
const TICK = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }));
const client = readFileSync(new URL("../../dist/pollbox.js", import.meta.url));

const KEYS = Array.from({ length: 10 }, (_, i) => "cpu-" + i);

function page(kind, url) {
  const follow =
    kind === "bare"
      ? `const es = new EventSource(${JSON.stringify(url + "/v1/boxes?keys=" + KEYS.join(","))}); es.onmessage = (e) => take(JSON.parse(e.data));`
      : `new Pollbox({ url: ${JSON.stringify(url)}, eventSource: ${kind === "client"} }).follow({ keys: ${JSON.stringify(KEYS)} }, { update: take });`;
  return `<!doctype html><html><body><img src="/hold"><script type="module">
import { Pollbox } from "/pollbox.js";
let n = 0, last = null, t0 = 0, n0 = 0;
function take(p) { n++; last = p; }
${follow}
const go = async (what) => fetch("/" + what, { cache: "no-store" });
await go("ready");
t0 = performance.now(); n0 = n;
await go("measure");
const ms = performance.now() - t0;
await go("report?" + JSON.stringify({ updates: n - n0, ms, lastVer: last && last.ver }));
</script></body></html>`;
}

/** CPU seconds of `pids` (utime + stime). */
function cpu(pids) {
  let t = 0;
  for (const pid of pids) {
    try {
      const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
      t += (Number(f[11]) + Number(f[12])) / TICK;
    } catch {}
  }
  return t;
}

/** Chromium's processes below `root`: all, and the renderers. */
function chromiumProcesses(root) {
  const parent = new Map();
  for (const d of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      parent.set(Number(d), Number(readFileSync(`/proc/${d}/stat`, "utf8").split(") ")[1].split(" ")[1]));
    } catch {}
  }
  const all = [root];
  for (let grew = true; grew; ) {
    grew = false;
    for (const [p, pp] of parent) if (all.includes(pp) && !all.includes(p)) (all.push(p), (grew = true));
  }
  const renderers = all.filter((p) => {
    try {
      return readFileSync(`/proc/${p}/cmdline`, "utf8").includes("--type=renderer");
    } catch {
      return false;
    }
  });
  return { all, renderers };
}

async function run(kind, s) {
  const port = await freePort();
  let report;
  const waiting = {};
  const wait = (name) => new Promise((ok) => (waiting[name] = ok));
  const release = {};
  const server = http.createServer((req, res) => {
    const path = req.url.slice(1);
    const answer = (type, body = "") => (res.writeHead(200, { "Content-Type": type }), res.end(body));
    if (path === "pollbox.js") return answer("text/javascript", client);
    if (path.startsWith("report?")) {
      report = JSON.parse(decodeURIComponent(path.slice(7)));
      return answer("text/plain");
    }
    if (["ready", "measure", "hold"].includes(path)) {
      waiting[path]?.();
      release[path] = () => answer("text/plain");
      return;
    }
    answer("text/html", page(kind, s.url));
  });
  await new Promise((ok) => server.listen(port, "127.0.0.1", ok));
  const ready = wait("ready");
  const profile = mkdtempSync(join(tmpdir(), "pollbox-cpu-"));
  const chromium = spawn(
    "chromium",
    ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--dump-dom",
      `--user-data-dir=${profile}`, `http://127.0.0.1:${port}/`],
    // Its own process group, so that the whole browser (its renderers and
    // helpers, which outlive a killed parent) is killed at once.
    { stdio: "ignore", detached: true },
  );
  await ready;
  await sleep(2000); // warm: the stream open, the updates flowing
  const procs = chromiumProcesses(chromium.pid);
  const measured = wait("measure");
  release.ready();
  await measured;
  const [r0, a0] = [cpu(procs.renderers), cpu(procs.all)];
  await sleep(SECONDS * 1000);
  const [r1, a1] = [cpu(procs.renderers), cpu(procs.all)];
  release.measure();
  await until("the report", () => report, 10000);
  release.hold?.();
  const exited = new Promise((ok) => chromium.once("exit", ok));
  process.kill(-chromium.pid, "SIGKILL");
  await exited;
  server.closeAllConnections();
  server.close();
  // Chromium's children may still be writing its profile after the main
  // process is gone: retry the removal a little.
  rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
  return { kind, ...report, rendererMs: (r1 - r0) * 1000, chromiumMs: (a1 - a0) * 1000 };
}

const s = await Pollbox.start(`[http]\ncors_origins = ["*"]\n`);
// 1,000 updates/s: a POST into each of the 10 boxes every 10 ms, pipelined.
const body = '{"value":1,"player":"bench"}';
const req = KEYS.map(
  (k) => `POST /v1/boxes/${k} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
).join("");
const sock = net.connect(s.port, "127.0.0.1");
sock.on("data", () => {});
let posted = 0;
const pump = setInterval(() => {
  sock.write(req);
  posted += 10;
}, 10);
const rows = [];
for (let r = 0; r < ROUNDS; r++) for (const kind of ["bare", "client", "client-fetch"]) rows.push(await run(kind, s));
clearInterval(pump);
sock.destroy();
await s.close();
console.log(`${SECONDS} s a run, ${ROUNDS} rounds; CPU per update delivered (µs), renderer and all of Chromium`);
console.log("kind     updates/s  renderer µs/update  chromium µs/update");
for (const x of rows) {
  const rate = (x.updates / x.ms) * 1000;
  console.log(
    `${x.kind.padEnd(8)} ${rate.toFixed(0).padStart(9)} ${((x.rendererMs * 1000) / x.updates).toFixed(1).padStart(19)} ${((x.chromiumMs * 1000) / x.updates).toFixed(1).padStart(19)}`,
  );
}
const sum = (k, f) => rows.filter((x) => x.kind === k).reduce((a, x) => a + f(x), 0);
for (const [name, f] of [["renderer", (x) => x.rendererMs], ["chromium", (x) => x.chromiumMs]]) {
  const per = (k) => sum(k, f) / sum(k, (x) => x.updates);
  for (const k of ["client", "client-fetch"]) {
    console.log(`${name}: ${k}/bare = ${(per(k) / per("bare")).toFixed(3)} (${(per("bare") * 1000).toFixed(1)} -> ${(per(k) * 1000).toFixed(1)} µs/update)`);
  }
}
process.exit(0);
