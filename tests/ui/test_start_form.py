"""The body of ``POST /api/runs`` is decoded once (higgsfield.control.ui.app.StartForm): what the page sends reads as
a form, anything else as None (answered 400, as tests/ui/test_malformed_requests.py pins over HTTP)."""

from __future__ import annotations

import pytest

from higgsfield.control.ui.app import StartForm

pytestmark = pytest.mark.timeout(30)


def test_the_pages_body_reads_as_a_form() -> None:
    assert StartForm.parse({"experiment": "exp", "values": {"steps": 3}, "check": True}) == \
        StartForm("exp", {"steps": 3}, check=True)
    assert StartForm.parse({"experiment": "exp"}) == StartForm("exp", {})          # no values: none
    assert StartForm.parse({"experiment": "exp", "values": {}, "check": 1}) == StartForm("exp", {}, check=True)
    assert StartForm.parse({"experiment": "exp", "values": {}, "check": None}) == StartForm("exp", {})


@pytest.mark.parametrize("body", [
    None, [], "exp", {}, {"experiment": 1}, {"experiment": "exp", "values": [1]}, {"experiment": "exp", "values": None},
])
def test_anything_else_is_none(body: object) -> None:
    assert StartForm.parse(body) is None
