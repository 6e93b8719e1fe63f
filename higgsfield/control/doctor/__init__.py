"""``higgsfield doctor``: a read-only preflight of every node, in parallel, in seconds.

Per node: reachable over SSH, host key pinned and matching, passwordless sudo, Docker
usable by the login user, GPUs (count, driver, CUDA) or none, free disk where images
and checkpoints go, clock skew against this machine, the invoker at this version, the
project environment that ``runtime: process`` runs in (present / stale / missing); and
across nodes: node 0 reachable from the others on the rendezvous port range (node 0
listens briefly on a free port there, the others connect).

Nothing on a node is changed and no host key is pinned: a node that is not pinned, or
whose key changed, is refused before authentication and reported with the key it
offers (``higgsfield setup`` pins it; ``setup --repin`` re-pins it), and no check runs
there, since its identity is unverified. Every problem comes with the command that fixes it.

A node costs two SSH sessions, whatever the checks: one probe asks it every read-only
command at once and measures its clock (:mod:`higgsfield.control.remote.probe`), and one more
listens (node 0) or connects (the others) for the rendezvous check, which runs
meanwhile. Each check is a function of the probe's answers.

A Slurm cluster's login node (``diagnose(cfg.on_login_node())``) gets the checks that
mean something there: the clock, the invoker and the project environment in the
workdir, and Slurm's own view (:mod:`higgsfield.control.backends.slurm.preflight`): the commands, the
partition with its nodes, idle nodes and GPUs from sinfo, and a run's job accepted.

The package, one concept a module:

- :mod:`~higgsfield.control.doctor.diagnosis`: :func:`diagnose`, the SSH side (connect, host key, one probe a node);
- :mod:`~higgsfield.control.doctor.probe`: the commands a node is asked, and its answers (:class:`Facts`);
- :mod:`~higgsfield.control.doctor.checks`: each check, a function of a node's answers;
- :mod:`~higgsfield.control.doctor.rendezvous`: node 0 reachable from the others, with the two scripts it runs;
- :mod:`~higgsfield.control.doctor.report`: the result types (:class:`DoctorReport`).
- :mod:`~higgsfield.control.doctor.fabric`: ``doctor --fabric``, a collective benchmark started like a run
  (SSH nodes, or a short Slurm job), and :mod:`~higgsfield.control.doctor.preflight`: ``run --preflight``,
  the benchmark before a run and the slow nodes passed over.

Use::

    report = await diagnose(cfg)
    report.ok, report.problems(), encode(report.as_json())
"""

from __future__ import annotations

from higgsfield.control.doctor.checks import _usage
from higgsfield.control.doctor.diagnosis import diagnose
from higgsfield.control.doctor.probe import Facts, _usage_argv
from higgsfield.control.doctor.report import DoctorReport

# what other code imports from here (the CLI: diagnose, DoctorReport; tests: Facts and the usage check)
__all__ = ["DoctorReport", "Facts", "_usage", "_usage_argv", "diagnose"]
