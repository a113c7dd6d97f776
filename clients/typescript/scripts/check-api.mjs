// Fails when src/api.ts is not what openapi-typescript generates from
// ../openapi.json (the copy of the document `warden serve` serves, which a
// Rust test keeps equal to it): the client's types are the contract's.
// `npm run gen` regenerates it.

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const dir = mkdtempSync(join(tmpdir(), "warden-api-"));
try {
  const fresh = join(dir, "api.ts");
  execFileSync("node_modules/.bin/openapi-typescript", ["../openapi.json", "-o", fresh], { stdio: "pipe" });
  if (readFileSync(fresh, "utf8") !== readFileSync("src/api.ts", "utf8")) {
    console.error("src/api.ts is not generated from ../openapi.json: run `npm run gen` and review the diff");
    process.exit(1);
  }
  console.log("src/api.ts matches ../openapi.json");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
