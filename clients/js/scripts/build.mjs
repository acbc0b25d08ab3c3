// The client's build: type-check and write the type definitions (tsc), bundle
// and minify the ES module (esbuild), and print its size against the budget
// (6 KB minified and gzipped); a bundle over budget fails the build.
// What it is not: a test; `npm test` runs this first, then the tests.
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

const BUDGET = 6 * 1024;
const here = new URL("..", import.meta.url).pathname;
rmSync(here + "dist", { recursive: true, force: true });
execFileSync(here + "node_modules/.bin/tsc", ["-p", here], { stdio: "inherit" });
await build({
  entryPoints: [here + "src/pollbox.ts"],
  outfile: here + "dist/pollbox.js",
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: true,
  legalComments: "none",
});
// The modules the unit tests reach into, apart (not in the package).
await build({
  entryPoints: ["sse", "backoff", "versions", "access", "presence"].map((m) => here + "src/" + m + ".ts"),
  outdir: here + "dist/internal",
  bundle: true,
  format: "esm",
  target: "es2020",
});
const js = readFileSync(here + "dist/pollbox.js");
const gz = gzipSync(js, { level: 9 }).length;
console.log(`dist/pollbox.js: ${js.length} B minified, ${gz} B gzipped (budget ${BUDGET} B)`);
if (gz > BUDGET) {
  console.error(`over the size budget by ${gz - BUDGET} B`);
  process.exit(1);
}
