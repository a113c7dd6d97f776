// `node path/to/clients/typescript/scripts/pack.mjs [DIR]`: builds the
// package into an npm tarball in DIR (default: the current directory) and
// prints its name — out of the checkout: its sources are copied into a
// temporary directory, which gets the build's dependencies (from the lock
// file) and the compiled dist/, then is `npm pack`ed and removed. Nothing
// is written beside the sources (installing the directory itself would
// leave its node_modules, 47 MB, and dist/ there).

import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const destination = resolve(process.argv[2] ?? ".");
const dir = mkdtempSync(join(tmpdir(), "warden-client-"));
// stdout is the tarball's name alone: npm's and tsc's output go to stderr.
const run = (command, args) => execFileSync(command, args, { cwd: dir, stdio: ["ignore", "pipe", "inherit"] }).toString();
// The npm running this script (`npm exec`), else the one on PATH.
const npm = (args) =>
  process.env.npm_execpath ? run(process.execPath, [process.env.npm_execpath, ...args]) : run("npm", args);
try {
  for (const name of ["package.json", "package-lock.json", "tsconfig.json", "README.md", "src"]) {
    cpSync(join(root, name), join(dir, name), { recursive: true });
  }
  process.stderr.write(npm(["ci", "--ignore-scripts", "--no-audit", "--no-fund"]));
  process.stderr.write(run(process.execPath, [join(dir, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"]));
  // Built: the tarball has no build to prepare (and no scripts/ to run it).
  npm(["pkg", "delete", "scripts.prepare"]);
  const packed = npm(["pack", "--ignore-scripts", "--pack-destination", destination]).trim().split("\n").at(-1);
  console.log(join(destination, packed));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
