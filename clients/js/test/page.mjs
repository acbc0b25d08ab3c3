// A page that follows boxes with the client in headless Chromium, and what
// drives it: the page's own origin (a Node server: the page, the built
// client, `/report?...` from the page to the test, `/hold` that keeps the
// page's load event pending, `/go` that tells it to finish), Chromium with
// `--dump-dom` (as crates/pollbox/tests/browser.rs drives it), and the
// page's results read back from the DOM.
// What it is not: a browser automation library; the page reports, the test
// waits for reports.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";

const client = new URL("../dist/pollbox.js", import.meta.url);

/** The page: follows `target` (keys, or a target such as `{ prefix }`) on
 * `pollbox` with `options` (`tokenUrl`: a token function that fetches a
 * token from that path of the page's origin); records every payload,
 * deletion, mode and error, any version older than one shown, and when each
 * update came (`times`, epoch ms: the test's clock, at the end). */
function html(pollbox, target, { tokenUrl, ...options } = {}) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>pollbox client</title></head>
<body><pre id="results">pending</pre><img src="/hold" alt="">
<script type="module">
import { Pollbox } from "/pollbox.js";
const results = { last: {}, shown: 0, older: [], deleted: [], modes: [], errors: [] };
const times = [];
const record = () => { document.getElementById("results").textContent = JSON.stringify(results); };
const report = (what) => fetch("/report?" + encodeURIComponent(what), { cache: "no-store" }).catch(() => {});
const options = ${JSON.stringify(options)};
${tokenUrl ? `options.token = () => fetch(${JSON.stringify(tokenUrl)}, { cache: "no-store" }).then((r) => r.text());` : ""}
const pb = new Pollbox({ url: ${JSON.stringify(pollbox)}, ...options });
const f = pb.follow(${JSON.stringify(Array.isArray(target) ? { keys: target } : target)}, {
  update(p) {
    const before = results.last[p.k];
    if (before && before.ver >= p.ver) results.older.push([p.k, before.ver, p.ver]);
    results.last[p.k] = p;
    results.shown++;
    times.push(Date.now());
    record();
    report("seen=" + p.k + ":" + p.v);
  },
  deleted(k) { results.deleted.push(k); delete results.last[k]; record(); report("deleted=" + k); },
  mode(m) { results.modes.push(m); record(); report("mode=" + m); },
  error(e, fatal) { results.errors.push({ status: e.status, fatal }); record(); },
});
fetch("/go", { cache: "no-store" }).then(() => { f.close(); results.times = times; record(); report("finished"); });
record();
</script></body></html>`;
}

/** The page's origin, Chromium on it, and the reports it sends. */
export class Page {
  /** The page on `port` (reserved before pollbox started, so that its
   * `cors_origins` can name the page's origin), following `target`: an
   * array of keys, or `{ prefix }`; `routes` are more paths of its origin,
   * each a function that gives the text of its answer (a token). */
  static async open(port, pollboxUrl, target, options, routes = {}) {
    const p = new Page(html(pollboxUrl, target, options), routes);
    await new Promise((ok) => p.server.listen(port, "127.0.0.1", ok));
    p.origin = `http://127.0.0.1:${p.server.address().port}`;
    return p;
  }

  constructor(page, routes = {}) {
    this.reports = new Set();
    this.log = [];
    this.waiters = [];
    this.held = [];
    this.released = { hold: false, go: false };
    this.server = http.createServer((req, res) => {
      const url = new URL(req.url, "http://x");
      const send = (type, body) => {
        res.writeHead(200, { "Content-Type": type, "Cache-Control": "no-store" });
        res.end(body);
      };
      if (url.pathname === "/pollbox.js") return send("text/javascript", readFileSync(client));
      if (Object.hasOwn(routes, url.pathname)) return send("text/plain", routes[url.pathname]());
      if (url.pathname === "/report") {
        const what = url.search.slice(1);
        this.got(decodeURIComponent(what));
        return send("text/plain", "");
      }
      if (url.pathname === "/hold" || url.pathname === "/go") {
        const name = url.pathname.slice(1);
        if (this.released[name]) return send("text/plain", "");
        this.held.push([name, () => send("text/plain", "")]);
        return;
      }
      send("text/html; charset=utf-8", page);
    });
  }

  /** Start Chromium on the page (it runs until `finish()`). */
  launch() {
    this.profile = mkdtempSync(join(tmpdir(), "pollbox-js-chromium-"));
    const args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"];
    this.chromium = spawn("chromium", [...args, "--dump-dom", `--user-data-dir=${this.profile}`, this.origin + "/"], {
      stdio: ["ignore", "pipe", "ignore"],
    });
    let out = "";
    this.chromium.stdout.on("data", (d) => (out += d));
    this.dom = new Promise((ok, fail) => {
      this.chromium.on("error", (e) => fail(new Error("chromium on PATH (Debian package chromium): " + e.message)));
      this.chromium.on("exit", () => ok(out));
    });
  }

  got(what) {
    this.reports.add(what);
    this.log.push(what);
    this.waiters = this.waiters.filter((w) => !w());
  }

  /** Wait until the page has reported each of `wanted`. */
  waitFor(wanted, ms = 60000) {
    return new Promise((ok, fail) => {
      const check = () => {
        if (!wanted.every((w) => this.reports.has(w))) return false;
        clearTimeout(timer);
        ok();
        return true;
      };
      const timer = setTimeout(() => {
        const missing = wanted.filter((w) => !this.reports.has(w));
        fail(new Error(`the page did not report ${missing.join(", ")}; its last reports: ${this.log.slice(-20).join(" ")}`));
      }, ms);
      if (!check()) this.waiters.push(check);
    });
  }

  release(name) {
    this.released[name] = true;
    for (const [n, answer] of this.held.filter(([n]) => n === name)) answer();
    this.held = this.held.filter(([n]) => n !== name);
  }

  /** Tell the page to finish, let its load end, and read what it wrote. */
  async finish() {
    this.release("go");
    await this.waitFor(["finished"], 30000);
    this.release("hold");
    const dom = await this.dom;
    const start = dom.indexOf('<pre id="results">') + '<pre id="results">'.length;
    const text = dom.slice(start, dom.indexOf("</pre>", start));
    const unescaped = text.replaceAll("&quot;", '"').replaceAll("&lt;", "<").replaceAll("&gt;", ">").replaceAll("&amp;", "&");
    return JSON.parse(unescaped);
  }

  async close() {
    this.release("go");
    this.release("hold");
    if (this.chromium && this.chromium.exitCode === null) this.chromium.kill("SIGKILL");
    this.server.closeAllConnections?.();
    await new Promise((ok) => this.server.close(ok));
    if (this.profile) rmSync(this.profile, { recursive: true, force: true });
  }
}
