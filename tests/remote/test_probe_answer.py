"""The probe's answer is decoded once (higgsfield.control.remote.probe): a real answer gives every read's result
and the login's uid; anything else is the one-line ``error`` the caller falls back on, with no answers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from typing import Any

import pytest

from higgsfield.control.remote.base import CommandResult
from higgsfield.control.remote.local import LocalTransport
from higgsfield.control.remote.probe import Probe, Read, probe

pytestmark = pytest.mark.timeout(60)

READS = [Read(("echo", "hi")), Read(("sh", "-c", "echo no >&2; exit 3"))]


def test_a_real_probe_answers_every_read_and_the_uid() -> None:
    got = asyncio.run(probe(LocalTransport(), READS))
    assert got.error is None and got.uid == os.getuid()
    hi, bad = (got.answer(r) for r in READS)
    assert hi is not None and (hi.exit_status, hi.stdout, hi.stderr) == (0, "hi\n", "")
    assert bad is not None and (bad.exit_status, bad.stdout, bad.stderr) == (3, "", "no\n")


class Answers:
    """A node whose python3 prints ``stdout`` and exits ``code``."""

    node = "n"
    command_timeout = None

    def __init__(self, stdout: str, code: int = 0, stderr: str = "") -> None:
        self.result = (code, stdout, stderr)

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        return CommandResult("n", tuple(argv), *self.result)


def _probe(stdout: str, code: int = 0, stderr: str = "") -> Probe:
    return asyncio.run(probe(Answers(stdout, code, stderr), READS))  # type: ignore[arg-type]


def test_a_good_answer_after_other_lines_is_read_from_its_last_line() -> None:
    answer = json.dumps({"uid": 1000, "results": [[0, "hi\n", "", False], [1, "", "denied", True]]})
    got = _probe(f"Welcome!\n{answer}\n")
    assert got.error is None and got.uid == 1000
    ran = got.answer(READS[1])
    assert ran is not None and ran.argv == ("sudo", "-n", *READS[1].argv) and ran.exit_status == 1


@pytest.mark.parametrize("stdout", [
    "", "not json", "[]", '{"uid": 0}', '{"uid": "root", "results": []}',
    json.dumps({"uid": 0, "results": [[0, "hi", "", False]]}),                   # one answer of two
    json.dumps({"uid": 0, "results": [[0, "hi", "", False], [0, "x", ""]]}),     # a short answer
    json.dumps({"uid": 0, "results": [[0, "hi", "", False], ["0", "x", "", False]]}),
])
def test_an_answer_that_does_not_decode_is_one_line_and_no_answers(stdout: str) -> None:
    got = _probe(stdout)
    tail = stdout.strip().splitlines()[-1][:200] if stdout.strip() else "no output"
    assert got.error == f"the probe (python3) exited 0: {tail}" and got.answers == {} and got.uid is None


def test_a_probe_that_fails_names_its_exit_and_last_line() -> None:
    got = _probe("", 127, "sh: python3: not found\n")
    assert got.error == "the probe (python3) exited 127: sh: python3: not found" and got.answers == {}
