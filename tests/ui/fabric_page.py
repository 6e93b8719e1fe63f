"""The Nodes view's fabric marks in a real browser, over nodes that just ran a real fabric test.

Called by the bed test that slows one node's link for real and runs ``run --preflight``
(tests/provision/test_doctor_fabric.py): its fabric run's result is on node 0, so a dashboard
started now must show every node's figures and mark the slowed one, without running anything
more (the bed's time is scarce). Not a test module itself: it has no cluster of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from ui_helpers import dashboard, launch_browser, open_page


def check_fabric_marks(project: Path, nodes: Sequence[str], slow: str) -> float:
    """Start ``higgsfield ui`` in ``project``; the Nodes view marks ``slow`` "slow in the last preflight" and
    shows each node's busbw, write speed, GPU health and time. Returns the seconds until the marks showed."""
    from playwright.sync_api import expect

    with dashboard(project) as d, launch_browser() as browser:
        t0 = time.monotonic()
        page = open_page(browser, d, "#nodes")
        card = page.locator(f'.node[data-node="{slow}"]')
        expect(card.locator(".health .mark-slow")).to_have_text("slow in the last preflight", timeout=20000)
        took = time.monotonic() - t0
        expect(card.locator(".health")).to_contain_text(f"{slow} is slow: its best link")
        for n in nodes:
            fab = page.locator(f'.node[data-node="{n}"] .fabric')
            expect(fab.locator(".fab-busbw")).to_contain_text("GB/s")
            expect(fab.locator(".fab-write")).to_contain_text("MB/s")
            expect(fab.locator(".fab-gpu")).to_have_text(" · GPU n/a")      # CPU nodes
            if n != slow:
                expect(page.locator(f'.node[data-node="{n}"] .mark-slow')).to_have_count(0)
        expect(page.locator("#nav-nodes")).to_contain_text("1 slow")
        page.close()
    return took
