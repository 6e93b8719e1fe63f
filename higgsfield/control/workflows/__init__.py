"""GitHub Actions for a higgsfield project: thin, safe workflows and the inputs their jobs read.

``higgsfield build-experiments`` renders ``templates/workflows/*.j2`` into
``.github/workflows/``: ``deploy.yml``, one ``run_<experiment>.yml`` form per
experiment and ``kill.yml``. Each job installs higgsfield and calls one
``higgsfield ci ...`` command, so the logic lives (and is tested) here, not in YAML.

Use::

    result = build_workflows(cfg)                     # writes, removes stale, spares user files
    files = render_workflows(cfg, discover(src))      # {"deploy.yml": "...", ...}, no disk writes
    inputs = run_inputs(exp, os.environ, len(cfg.nodes))   # what a GitHub form sent

Modules: :mod:`~higgsfield.control.workflows.form` (``@param`` -> form inputs),
:mod:`~higgsfield.control.workflows.render` (Jinja2), :mod:`~higgsfield.control.workflows.build`
(the files on disk), :mod:`~higgsfield.control.workflows.ci_inputs` (the job's environment).
"""

from higgsfield.control.workflows.build import BuildResult, build_workflows, is_generated
from higgsfield.control.workflows.ci_inputs import RunInputs, ci_config, kill_target, run_inputs
from higgsfield.control.workflows.form import FormInput, form_inputs
from higgsfield.control.workflows.render import HEADER_MARKER, render_workflows

__all__ = [
    "HEADER_MARKER",
    "BuildResult",
    "FormInput",
    "RunInputs",
    "build_workflows",
    "ci_config",
    "form_inputs",
    "is_generated",
    "kill_target",
    "render_workflows",
    "run_inputs",
]
