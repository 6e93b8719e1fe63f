"""Where a project's runs happen, behind one seam: SSH nodes or a Slurm cluster.

The CLI, the Actions jobs and the dashboard see only :class:`.backend.Backend` and
its :class:`.backend.Session` (:func:`backend_for` picks one), and the dashboard
watches it through the backend's :class:`.backend.Fleet`; each backend package
(:mod:`.nodes`, :mod:`.slurm`) holds its whole control side. A third backend is one
more package with its Backend / Session pair and its fleet, and nothing in ``ui``.
"""

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

__all__ = ["Backend", "Changed", "Fleet", "NoStacks", "RunList", "RunRequest", "Session", "StacksResult", "backend_for",
           "stall_settings"]
