"""Where a project's runs happen, behind one seam: SSH nodes or a Slurm cluster.

The CLI, the Actions jobs and the dashboard see only :class:`.backend.Backend` and
its :class:`.backend.Session` (:func:`backend_for` picks one); each backend
package (:mod:`.nodes`, :mod:`.slurm`) holds its whole control side. A third
backend is one more package with one class pair.
"""

from higgsfield.control.backends.backend import Backend, RunList, RunRequest, Session
from higgsfield.control.backends.select import backend_for

__all__ = ["Backend", "RunList", "RunRequest", "Session", "backend_for"]
