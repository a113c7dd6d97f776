// `npm run prepare`: builds dist/ (tsc) wherever the package is installed
// from its source — `npm install` here, and a consumer's
// `npm install path/to/clients/typescript` or a git URL.
//
// npm links a path dependency and runs its `prepare` without installing
// its dependencies (npm 10 and 11 do so), so `tsc` and the runtime's
// `eventsource-parser` would be missing: when they are, they are installed
// here first from the lock file (scripts off: no recursion).

import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = (command, args) => execFileSync(command, args, { cwd: root, stdio: "inherit" });
// The npm running this script (its CLI, under this Node), else the one on PATH.
const npm = (args) =>
  process.env.npm_execpath ? run(process.execPath, [process.env.npm_execpath, ...args]) : run("npm", args);

const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
const parser = join(root, "node_modules", "eventsource-parser", "package.json");
if (!existsSync(tsc) || !existsSync(parser)) {
  const lock = existsSync(join(root, "package-lock.json"));
  npm([lock ? "ci" : "install", "--ignore-scripts", "--no-audit", "--no-fund"]);
}
run(process.execPath, [tsc, "-p", "tsconfig.json"]);
