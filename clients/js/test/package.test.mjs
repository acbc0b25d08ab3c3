// The package as a user gets it: `npm pack`, installed offline into an empty
// project, imported by name, with its type definitions; and the size budget.
// What it is not: a test of the client's behaviour (server.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

const here = new URL("..", import.meta.url).pathname;

test("npm pack makes a package that installs and imports offline, with its types", () => {
  const dir = mkdtempSync(join(tmpdir(), "pollbox-client-pack-"));
  try {
    const out = execFileSync("npm", ["pack", "--json", "--pack-destination", dir], { cwd: here, encoding: "utf8" });
    const [{ filename, files }] = JSON.parse(out.slice(out.indexOf("[")));
    const names = files.map((f) => f.path).sort();
    assert.ok(names.includes("dist/pollbox.js") && names.includes("dist/pollbox.d.ts"), names.join(" "));
    assert.ok(!names.some((n) => n.startsWith("dist/internal/") || n.startsWith("src/")), names.join(" "));
    const app = join(dir, "app");
    execFileSync("mkdir", ["-p", app]);
    writeFileSync(join(app, "package.json"), '{"name":"app","type":"module","private":true}');
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", join(dir, filename)], { cwd: app });
    const got = execFileSync(
      "node",
      ["-e", "import('pollbox-client').then(m => console.log(typeof m.Pollbox, typeof m.PollboxError))"],
      { cwd: app, encoding: "utf8" },
    );
    assert.equal(got.trim(), "function function");
    assert.ok(existsSync(join(app, "node_modules/pollbox-client/dist/pollbox.d.ts")));
    const lock = JSON.parse(readFileSync(join(app, "package-lock.json"), "utf8"));
    assert.deepEqual(Object.keys(lock.packages).sort(), ["", "node_modules/pollbox-client"], "no runtime dependencies");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the bundle is within 6 KB minified and gzipped", () => {
  const gz = gzipSync(readFileSync(join(here, "dist/pollbox.js")), { level: 9 }).length;
  assert.ok(gz <= 6144, gz + " B");
});
