// What the client's tests start and drive: the real pollbox binary (the
// release build) on a port of its own, HTTP proxies in front of it (one that
// passes bytes through and can cut every connection, one that buffers whole
// answers as a buffering proxy does, one that drops answers), HS256 tokens,
// a writer that moves a box 20 times a second, and plain requests that do
// not go through the client.
// What it is not: the client, nor a fake of pollbox: every answer the client
// sees comes from the binary.
import { spawn } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const repo = new URL("../../..", import.meta.url).pathname;

/** The release binary (or $POLLBOX_BIN); a clear failure when it is missing. */
export function binary() {
  const bin = process.env.POLLBOX_BIN ?? join(repo, "target/release/pollbox");
  if (!existsSync(bin)) {
    throw new Error(`no pollbox binary at ${bin}: run \`cargo build --release -p pollbox\` in ${repo} first`);
  }
  return bin;
}

/** A port nothing listens on now (the kernel's pick, given back). */
export async function freePort() {
  const s = net.createServer();
  await new Promise((ok) => s.listen(0, "127.0.0.1", ok));
  const { port } = s.address();
  await new Promise((ok) => s.close(ok));
  return port;
}

export const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

/** Poll `f` until it is truthy (or throw after `ms`, naming `what`). */
export async function until(what, f, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await sleep(20);
  }
}

/**
 * `pollbox serve` on its own port with `toml` added to its config (`$DIR` is
 * its folder; `opts.before(dir)` writes what the config names before the
 * start); stop() and start() again on the same port (with the same snapshot,
 * if configured).
 */
export class Pollbox {
  static async start(toml = "", opts = {}) {
    const p = new Pollbox(toml, opts);
    p.port = opts.port ?? (await freePort());
    await p.start();
    return p;
  }

  constructor(toml, opts) {
    this.dir = mkdtempSync(join(tmpdir(), "pollbox-js-"));
    this.toml = toml.replaceAll("$DIR", this.dir);
    this.workers = opts.workers ?? 2;
    opts.before?.(this.dir);
    this.child = null;
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  async start() {
    const cfg = join(this.dir, "pollbox.toml");
    const server = `[server]\nlisten = "127.0.0.1:${this.port}"\nworkers = ${this.workers}\n`;
    writeFileSync(cfg, this.toml.includes("[server]") ? this.toml.replace("[server]", server) : server + this.toml);
    const child = spawn(binary(), ["serve", "--config", cfg], { stdio: ["ignore", "ignore", "pipe"] });
    this.child = child;
    const lines = createInterface({ input: child.stderr });
    const first = await new Promise((ok, fail) => {
      lines.once("line", ok);
      child.once("exit", (c) => fail(new Error("pollbox exited " + c + " before listening")));
    });
    if (!first.includes("listening on http://")) throw new Error("pollbox said: " + first);
    this.exited = new Promise((ok) => child.once("exit", (code, sig) => ok({ code, sig })));
    return this;
  }

  /** Signal the server (`SIGTERM`, `SIGKILL`) and wait for its exit. */
  async stop(sig = "SIGTERM") {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill(sig);
    const r = await this.exited;
    this.child = null;
    return r;
  }

  async close() {
    await this.stop("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** POST `{"value": v}` (and more fields) into `key`; the JSON answer. */
  async ingest(key, value, extra = {}, headers = {}) {
    const r = await fetch(`${this.url}/v1/boxes/${encodeURIComponent(key)}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...headers },
      body: JSON.stringify({ value, ...extra }),
    });
    if (r.status !== 200) throw new Error(`ingest ${key}: ${r.status} ${await r.text()}`);
    return r.json();
  }

  async remove(key, headers = {}) {
    const r = await fetch(`${this.url}/v1/boxes/${encodeURIComponent(key)}`, { method: "DELETE", headers });
    return r.status;
  }

  /** A plain poll: the payload, or null for 404. */
  async box(key, headers = {}) {
    const r = await fetch(`${this.url}/v1/boxes/${encodeURIComponent(key)}`, { headers });
    return r.status === 404 ? null : r.json();
  }
}

/**
 * An HTTP proxy in front of `target` (a port). `mode` may change while it
 * runs: "pass" streams answers through, "buffer" holds each answer until it
 * is complete (an event stream never is), "drop" forwards the request and
 * closes the client's connection instead of answering. `cut()` ends every
 * open connection. `requests` lists each request's method, URL and headers,
 * and whether its exchange is over (`closed`).
 */
export class Proxy {
  static async start(target, mode = "pass") {
    const p = new Proxy(target, mode);
    await new Promise((ok) => p.server.listen(0, "127.0.0.1", ok));
    p.port = p.server.address().port;
    return p;
  }

  constructor(target, mode) {
    this.target = target;
    this.mode = mode;
    this.requests = [];
    this.sockets = new Set();
    this.server = http.createServer((req, res) => this.forward(req, res));
    this.server.on("connection", (s) => {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
    });
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  forward(req, res) {
    const mode = this.mode;
    const seen = { method: req.method, url: req.url, headers: req.headers, mode, at: Date.now(), closed: false };
    this.requests.push(seen);
    res.on("close", () => (seen.closed = true));
    const up = http.request(
      { host: "127.0.0.1", port: this.target, method: req.method, path: req.url, headers: req.headers, agent: false },
      (answer) => {
        if (mode === "drop") {
          answer.resume();
          answer.on("end", () => res.socket?.destroy());
          return;
        }
        if (mode === "pass") {
          res.writeHead(answer.statusCode, answer.headers);
          res.flushHeaders();
          answer.pipe(res);
          return;
        }
        const chunks = [];
        answer.on("data", (c) => chunks.push(c));
        answer.on("end", () => {
          res.writeHead(answer.statusCode, answer.headers);
          res.end(Buffer.concat(chunks));
        });
      },
    );
    up.on("error", () => res.socket?.destroy());
    res.on("close", () => up.destroy());
    req.pipe(up);
  }

  cut() {
    for (const s of this.sockets) s.destroy();
  }

  async close() {
    this.cut();
    await new Promise((ok) => this.server.close(ok));
  }
}

/** The client's first reconnect window (its default `backoffMs`): the
 * longest an expiry may hold the updates back, plus a margin for a busy
 * machine. Before the fix, each expiry waited a window twice the last one's
 * (1 s, 2 s, ... 30 s), fetching the token before the wait. */
export const BACKOFF_MS = 1000;
export const GAP_MS = BACKOFF_MS + 1500;

/** A box written 20 times a second with a long-lived token, until `stop()`;
 * `n` is the last value written. */
export function writer(s, key, auth) {
  const w = { n: 0, at: [], writing: true };
  w.done = (async () => {
    while (w.writing) {
      await s.ingest(key, ++w.n, {}, auth);
      w.at.push(Date.now());
      await sleep(50);
    }
  })();
  w.stop = async () => {
    w.writing = false;
    await w.done;
  };
  return w;
}

/** The longest pauses between consecutive times, longest first. */
export const longest = (at) =>
  at
    .slice(1)
    .map((t, i) => t - at[i])
    .sort((a, b) => b - a)
    .slice(0, 5);

const b64 = (x) => Buffer.from(typeof x === "string" ? x : JSON.stringify(x)).toString("base64url");

/** An HS256 key set for `auth.jwt.keys_file`, and tokens signed with it. */
export class Tokens {
  constructor(dir) {
    this.secret = "pollbox-js-client-test-secret-32b";
    this.file = join(dir, "jwks.json");
    writeFileSync(this.file, JSON.stringify({ keys: [{ kty: "oct", kid: "k1", alg: "HS256", k: b64(this.secret) }] }));
  }

  /** A token that reads and writes `scope` (e.g. `["room-1/*"]`) for `seconds`
   * (signed with `secret`: another one makes a token the server refuses),
   * with `sub` and `pollbox.info` if given (a presence member). */
  mint(scope, seconds, secret = this.secret, { sub, info } = {}) {
    const head = b64({ alg: "HS256", typ: "JWT", kid: "k1" });
    const claims = b64({ exp: Math.floor(Date.now() / 1000) + seconds, sub, pollbox: { read: scope, write: scope, info } });
    const sig = createHmac("sha256", secret).update(head + "." + claims).digest("base64url");
    return `${head}.${claims}.${sig}`;
  }
}
