"""``higgsfield ui``: a live web dashboard of runs, queue, nodes, logs and training curves.

A thin ASGI layer (Starlette on uvicorn) over the same orchestrator calls as the
CLI's ``status``, ``logs``, ``kill`` and ``run``, showing the one typed model of a
run (:class:`higgsfield.contract.runstatus.RunStatus`, the JSON of ``status --json``):

- :mod:`~higgsfield.control.ui.security`: the token in the URL (then a cookie), CSRF and
  Host/Origin checks on every request, the response headers;
- :mod:`~higgsfield.control.ui.hub`: the dashboard's state and its actions (kill, re-run), over the
  backend's :class:`~higgsfield.control.backends.backend.Fleet` (``Backend.fleet``: for SSH nodes one
  live feed per node over the one connection the dashboard keeps open, for Slurm the login node asked);
- :mod:`~higgsfield.control.ui.runfeed`: a run's merged logs and step metrics, shared by every viewer;
- :mod:`~higgsfield.control.ui.app` / :mod:`~higgsfield.control.ui.server`: the routes and the server;
- ``static/``: the page (plain HTML, JS and CSS; uPlot vendored; no build step, no CDN).

Nothing here is imported by ``higgsfield --help``.
"""
