"""Bytes this rank sent to other nodes, and the time it spent sending them, since the last step (private).

Written by the cross-node collectives that higgsfield itself makes (DiLoCo's outer step,
:mod:`higgsfield._lib.diloco`); read once per step by :class:`higgsfield.training.StepTimer`,
which reports them in the step's metrics (``cross_node_bytes``, ``comm_s``) for the dashboard
and ``higgsfield metrics``. Its own module so the timer reads figures without importing the
parts that make them. FSDP's own collectives are not counted here (torch does not report
their bytes per link): a run without DiLoCo reports none, rather than a wrong figure.
"""

from __future__ import annotations

__all__ = ["add", "arm", "armed", "take"]

_state = {"armed": False, "bytes": 0, "seconds": 0.0}


def arm() -> None:
    """Say that this process meters its cross-node traffic: a step with none then reports 0, not None."""
    _state["armed"] = True


def armed() -> bool:
    return bool(_state["armed"])


def add(nbytes: int, seconds: float) -> None:
    _state["bytes"] = int(_state["bytes"]) + int(nbytes)
    _state["seconds"] = float(_state["seconds"]) + float(seconds)


def take() -> tuple[int, float] | None:
    """(bytes, seconds) since the last call, reset; None when nothing is metered in this process."""
    if not _state["armed"]:
        return None
    out = (int(_state["bytes"]), float(_state["seconds"]))
    _state["bytes"], _state["seconds"] = 0, 0.0
    return out
