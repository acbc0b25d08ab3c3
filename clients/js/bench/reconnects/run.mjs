// When 1,000 clients' reconnects reach a restarted server. 1,000 clients (one
// Node process, the built client, default backoff: 1 s first window doubling
// to 30 s) follow one box each on a pollbox; the server is killed (-9) and
// started again on the same port 1 s later; each client's first stream
// request answered 200 by the new server is timed from the kill. Prints the
// arrivals per 100 ms and the busiest 100 ms (its share of the 1,000).
// Usage: node bench/reconnects/run.mjs [clients] (POLLBOX_BIN as in the tests).
// What it is not: a test (nothing here fails on a number).
import { Pollbox as Client } from "../../dist/pollbox.js";
import { Pollbox, sleep, until } from "../../test/harness.mjs";

const N = Number(process.argv[2] ?? 1000);
const s = await Pollbox.start("[limits]\nmax_connections = 20000\n");
for (let i = 0; i < N; i++) await s.ingest("rc-" + i, 1);
let killedAt = 0;
const arrivals = [];
const followers = [];
let open = 0;
for (let i = 0; i < N; i++) {
  let counted = false;
  const pb = new Client({
    url: s.url,
    fetch: async (url, init) => {
      const sent = Date.now();
      const res = await fetch(url, init);
      if (killedAt && !counted && res.status === 200) {
        counted = true;
        arrivals.push(sent - killedAt);
      }
      return res;
    },
  });
  followers.push(pb.follow("rc-" + i, { update() {}, mode: () => open++ }));
}
await until("every stream open", () => open >= N, 120000);
await sleep(500);
killedAt = Date.now();
await s.stop("SIGKILL");
await sleep(1000);
await s.start();
const startedAt = Date.now() - killedAt;
await until("every client back", () => arrivals.length >= N, 120000);
for (const f of followers) f.close();
await Promise.all(followers.map((f) => f.done));
await s.close();

arrivals.sort((a, b) => a - b);
const buckets = new Map();
for (const t of arrivals) buckets.set(Math.floor(t / 100), (buckets.get(Math.floor(t / 100)) ?? 0) + 1);
const busiest = Math.max(...buckets.values());
console.log(`clients ${N}; server killed at 0 ms, started again at ${startedAt} ms`);
console.log(`reconnects answered by the new server: first ${arrivals[0]} ms, median ${arrivals[N >> 1]} ms, last ${arrivals[N - 1]} ms`);
console.log(`busiest 100 ms: ${busiest} reconnects (${((100 * busiest) / N).toFixed(1)} %)`);
console.log("per 100 ms from the kill (ms: count):");
for (const [b, c] of [...buckets].sort((x, y) => x[0] - y[0])) console.log(`  ${String(b * 100).padStart(6)}: ${c}`);
process.exit(0);
