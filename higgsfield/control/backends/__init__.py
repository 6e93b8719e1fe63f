"""Where a project's runs happen, behind one seam: SSH nodes or a Slurm cluster.

The CLI, the Actions jobs and the dashboard see only :class:`.backend.Backend` and
its :class:`.backend.Session` (:func:`backend_for` picks one), and the dashboard
watches it through the backend's :class:`.backend.Fleet`; each backend package
(:mod:`.nodes`, :mod:`.slurm`) holds its whole control side. A third backend is one
more package with its Backend / Session pair and its fleet, and nothing in ``ui``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from higgsfield.control.backends.backend import (
        Backend,
        Changed,
        Fleet,
        NoStacks,
        RunList,
        RunRequest,
        Session,
        StacksResult,
        stall_settings,
    )
    from higgsfield.control.backends.select import backend_for

# Imported when first used (PEP 562): a command that needs one backend module (data push) does not
# pay for every backend's import (a fifth of a second of a re-push that should take one).
_WHERE = {
    "Backend": "higgsfield.control.backends.backend",
    "Changed": "higgsfield.control.backends.backend",
    "Fleet": "higgsfield.control.backends.backend",
    "NoStacks": "higgsfield.control.backends.backend",
    "RunList": "higgsfield.control.backends.backend",
    "RunRequest": "higgsfield.control.backends.backend",
    "Session": "higgsfield.control.backends.backend",
    "StacksResult": "higgsfield.control.backends.backend",
    "stall_settings": "higgsfield.control.backends.backend",
    "backend_for": "higgsfield.control.backends.select",
}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = ["Backend", "Changed", "Fleet", "NoStacks", "RunList", "RunRequest", "Session", "StacksResult", "backend_for",
           "stall_settings"]
