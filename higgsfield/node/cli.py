"""``higgsfield invoker ...``: the node-side agent, called by the control side over a transport.

Hidden from ``--help``. Input arrives as JSON on stdin (so secrets never appear in
argv; ``start`` reads a :class:`~higgsfield.contract.runspec.StartRequest`, ``deploy`` a tar),
output is JSON on stdout: each node function returns the verb's typed, versioned reply
(:mod:`higgsfield.contract.replies`), and this edge only prints it
(:func:`~higgsfield.contract.codec.encode`). ``logs`` prints ``RANK<TAB>LINE`` per line, and
``#hb`` lines as a heartbeat with ``--heartbeat``.

    version | deployed | deploy | build | env | facts (drift) | fabric-last (dashboard) | start | status | logs | kill
    | stacks | profile | files (pull) | prune | usage (doctor)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from higgsfield import __version__
from higgsfield.contract.codec import encode
from higgsfield.contract.layout import DEFAULT_STATE_DIR
from higgsfield.node.state.home import NodeState


def _home(ctx: click.Context) -> NodeState:
    """The node's state of this invocation (``--state-dir``), built once by the group below."""
    home = ctx.find_object(NodeState)
    assert home is not None, "the invoker group builds it"
    return home


def _emit(reply: object) -> None:
    """The verb's reply (a contract type, or None) as one line of JSON: the CLI edge only serialises."""
    click.echo(json.dumps(encode(reply), sort_keys=True))


class _Verbs(click.Group):
    """The invoker's verbs, ``data`` loaded only when it is named.

    Every SSH command from the laptop starts an invoker, thousands in a day of ``status`` and ``logs``; the
    data verbs' import (their contract's types) was half of a ``version``'s 0.2 CPU-s, in every one.
    """

    LAZY = {"data": "higgsfield.node.data.cli"}   # verb -> the module that defines it, under that name

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            import importlib

            command = getattr(importlib.import_module(self.LAZY[cmd_name]), cmd_name)
            assert isinstance(command, click.Command), command
            return command
        return super().get_command(ctx, cmd_name)


@click.group(hidden=True, cls=_Verbs)
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, help="The node's state directory.")
@click.pass_context
def invoker(ctx: click.Context, state_dir: str) -> None:
    """Node-side agent: start, stop and report runs on this node."""
    ctx.obj = NodeState.at(state_dir)   # this group's own object: its verbs find it by type


@invoker.command()
def version() -> None:
    """Print this invoker's version."""
    from higgsfield.contract.replies import VersionReply

    _emit(VersionReply(version=__version__, python=sys.executable))


@invoker.command()
@click.option("--project", required=True)
@click.pass_context
def deployed(ctx: click.Context, project: str) -> None:
    """Print what is deployed for PROJECT on this node (null if nothing)."""
    from higgsfield.node.code.deploy import deployed as _deployed

    _emit(_deployed(_home(ctx), project))


@invoker.command()
@click.option("--project", required=True)
@click.option("--commit", required=True)
@click.option("--dirty", is_flag=True)
@click.pass_context
def deploy(ctx: click.Context, project: str, commit: str, dirty: bool) -> None:
    """Unpack the project tar on stdin as the new release; prints the verified deployment."""
    from higgsfield.node.code.deploy import unpack

    _emit(unpack(_home(ctx), project, commit, sys.stdin.buffer, dirty=dirty))


@invoker.command()
@click.option("--project", required=True)
@click.option("--code-dir", default=None, help="Build from this tree (default: the deployed code).")
@click.option("--dockerfile", default="Dockerfile", show_default=True)
@click.option("--base-image", default=None)
@click.option("--runtime", type=click.Choice(["auto", "docker", "process"]), default="auto", show_default=True)
@click.pass_context
def build(ctx: click.Context, project: str, code_dir: str | None, dockerfile: str, base_image: str | None,
          runtime: str) -> None:
    """Build the project's image unless its tag exists already."""
    from higgsfield.node.code.deploy import build as _build

    _emit(_build(_home(ctx), project, code_dir=Path(code_dir) if code_dir else None,
                 dockerfile=dockerfile, base_image=base_image, runtime=runtime))


@invoker.command("env")
@click.option("--project", required=True)
@click.option("--code-dir", default=None, help="For this tree (default: the deployed code).")
@click.option("--check", is_flag=True, help="Only report: present, stale or missing.")
@click.pass_context
def env_cmd(ctx: click.Context, project: str, code_dir: str | None, check: bool) -> None:
    """Build the project's environment for runtime: process (JSON lines: progress, then the result)."""
    from higgsfield.contract.replies import EnvLine
    from higgsfield.node.code import env_build, environment

    code = Path(code_dir) if code_dir else None
    if check:
        _emit(environment.status(_home(ctx), project, code))
        return
    result = env_build.build(_home(ctx), project, code_dir=code, progress=lambda m: _emit(EnvLine(progress=m)))
    _emit(EnvLine(result=result))


@invoker.command()
@click.option("--project", required=True)
@click.option("--runtime", type=click.Choice(["auto", "docker", "process"]), default="auto", show_default=True)
@click.option("--node", default="", help="This node's name in higgsfield.yml (echoed in the reply).")
@click.pass_context
def facts(ctx: click.Context, project: str, runtime: str, node: str) -> None:
    """What a run of PROJECT would use here (drivers, CUDA, NCCL, packages, keys), for the drift check."""
    from higgsfield.node.code.facts import facts as _facts

    _emit(_facts(_home(ctx), project, runtime, node))


@invoker.command("fabric-last", hidden=True)
@click.option("--project", required=True)
@click.pass_context
def fabric_last(ctx: click.Context, project: str) -> None:
    """(dashboard) The newest fabric test's result of PROJECT this node was node 0 of (null result: none)."""
    from higgsfield.node.observe.fabric_last import last_fabric

    _emit(last_fabric(_home(ctx), project))


@invoker.command()
@click.pass_context
def start(ctx: click.Context) -> None:
    """Start a run from {"spec": ..., "secrets": {...}, "token": ...} on stdin (node 0's record: coord_port).

    A spec this node cannot read (another version, a bad field) is refused before anything
    is written: one line on stderr, exit 2, which the control side shows as the node's error.
    A run name that an active run holds is refused the same way, with
    {"name_in_use": true, "run", "state", "node"} on stdout so the control side knows that
    this start made nothing here (and must not stop the run holding the name).
    """
    from higgsfield.contract.errors import RunNameInUse
    from higgsfield.contract.replies import NameInUseReply
    from higgsfield.contract.runspec import SpecError, read_request
    from higgsfield.node.runs.start import start_run

    try:
        payload = json.loads(sys.stdin.read())
    except ValueError:
        raise SpecError("the run request on stdin is not JSON") from None
    request = read_request(payload)  # refuses another version, re-checks every name
    try:
        reply = start_run(_home(ctx), request)
    except RunNameInUse as e:
        _emit(NameInUseReply(name_in_use=True, run=request.spec.run, state=e.state, node=request.spec.node))
        raise
    _emit(reply)


@invoker.command(hidden=True)
@click.argument("project")
@click.argument("run")
@click.option("--listen-fd", type=int, default=None, help="Node 0: the coordinator's listening socket.")
@click.pass_context
def supervise(ctx: click.Context, project: str, run: str, listen_fd: int | None) -> None:
    """(internal) Own one run until it ends."""
    from higgsfield.node.runs.supervise import supervise as _supervise

    sys.exit(_supervise(_home(ctx), project, run, listen_fd))


@invoker.command()
@click.option("--project", default=None)
@click.option("--run", "run_name", default=None)
@click.pass_context
def status(ctx: click.Context, project: str | None, run_name: str | None) -> None:
    """Print this node's runs: {"version": 1, "runs": [record + params], "skipped": [one line per bad file]}.

    A file that does not decode (a damaged record, a symlink, a directory that is no
    run's) is skipped with one line naming it; every other run still shows.
    """
    from higgsfield.contract.noderuns import StatusReply
    from higgsfield.node.observe.watch import node_runs

    runs, skipped = node_runs(_home(ctx), project, run_name)
    _emit(StatusReply(runs=runs, skipped=skipped))


@invoker.command()
@click.option("--project", required=True)
@click.option("--run", "run_name", required=True)
@click.option("--follow", "-f", is_flag=True)
@click.option("--rank", "ranks", type=int, multiple=True)
@click.option("--heartbeat", type=float, default=None, help="With -f: print '#hb' after this many quiet seconds.")
@click.option("--since", type=float, default=None, metavar="UNIXTIME",
              help="Only lines written from then on (a log without index: whole if modified since, else none).")
@click.option("--current", is_flag=True, help="Only the run's current attempt (what 'run' streams).")
@click.pass_context
def logs(ctx: click.Context, project: str, run_name: str, follow: bool, ranks: tuple[int, ...],
         heartbeat: float | None, since: float | None, current: bool) -> None:
    """Print RANK<TAB>LINE for every log line of a run (rank -1: the launcher), each attempt under its header."""
    from higgsfield.contract.errors import RunError
    from higgsfield.node.observe.logs import read_lines
    from higgsfield.node.runs.stop import refresh
    from higgsfield.node.state.records import RunDir

    rd = RunDir(_home(ctx), project, run_name)
    if not rd.exists():
        raise RunError(f"no run '{run_name}' of project '{project}' on this node")
    out = sys.stdout
    for rank, line in read_lines(rd, follow=follow, ranks=set(ranks) or None,
                                 is_done=lambda: refresh(rd).terminal, heartbeat=heartbeat, since=since,
                                 attempts=_attempts(rd) if since is None else [], current=current):
        out.write("#hb\n" if rank is None else f"{rank}\t{line}\n")
        out.flush()


def _attempts(rd: Any) -> list[Any]:
    """The record's attempts; none from a record that does not read (its logs are still all shown)."""
    from higgsfield.contract.errors import RunError

    try:
        return list(rd.read().attempts)
    except (RunError, OSError, ValueError):
        return []


@invoker.command()
@click.option("--project", required=True)
@click.option("--run", "run_name", default=None, help="Exactly this run.")
@click.option("--target", default=None, help="A run name, else every active run of this experiment.")
@click.option("--grace", type=float, default=3.0, show_default=True)
@click.option("--missing-ok", is_flag=True, help='With --run: print {"missing": true} if there is no such run.')
@click.option("--attempt", default=None, help='With --run: stop it only if that start made it, else print '
              '{"missing": true} (the clean-up of a failed start).')
@click.pass_context
def kill(ctx: click.Context, project: str, run_name: str | None, target: str | None, grace: float,
         missing_ok: bool, attempt: str | None) -> None:
    """Stop a run on this node; prints its final record (with --target: {"matched", "killed": [records]})."""
    from higgsfield.node.runs.stop import kill_run, kill_target

    if target is not None:
        _emit(kill_target(_home(ctx), project, target, grace=grace))
        return
    if run_name is None:
        raise click.UsageError("give --run or --target")
    _emit(kill_run(_home(ctx), project, run_name, grace=grace, missing_ok=missing_ok, attempt=attempt))


@invoker.command()
@click.option("--project", required=True)
@click.option("--run", "run_name", required=True)
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True, help="Only this global rank "
              "(repeatable).")
@click.option("--timeout", type=click.FloatRange(0.1, 60), default=3.0, show_default=True,
              help="Seconds to wait for the ranks' dumps.")
@click.pass_context
def stacks(ctx: click.Context, project: str, run_name: str, ranks: tuple[int, ...], timeout: float) -> None:
    """Print the Python stacks of the run's ranks here: taken now while it is active, else the ones saved at
    its stall ({"run", "state", "ranks": [RankStacks], "saved"}; no ranks: it ended without stalling)."""
    from higgsfield.contract.errors import RunError
    from higgsfield.contract.replies import StacksReply
    from higgsfield.contract.states import ACTIVE
    from higgsfield.node.runs.stacks import saved, take
    from higgsfield.node.runs.stop import refresh
    from higgsfield.node.state.records import RunDir

    rd = RunDir(_home(ctx), project, run_name)
    if not rd.exists():
        raise RunError(f"no run '{run_name}' of project '{project}' on this node")
    record = refresh(rd)
    found = take(rd, record.node, timeout=timeout) if record.state in ACTIVE else None
    at_stall = saved(rd) if not found else None
    out = found or at_stall or []
    if ranks:
        out = [s for s in out if s.rank in ranks]
    _emit(StacksReply(run=run_name, state=record.state, ranks=out, saved=bool(at_stall)))


@invoker.command()
@click.option("--project", required=True)
@click.option("--run", "run_name", required=True)
@click.option("--steps", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True, help="Only this global rank.")
@click.option("--memory", is_flag=True, help="Also a CUDA memory snapshot (GPU ranks).")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=60.0, show_default=True)
@click.pass_context
def profile(ctx: click.Context, project: str, run_name: str, steps: int, ranks: tuple[int, ...], memory: bool,
            timeout: float) -> None:
    """Profile the next STEPS steps of the run's live ranks here; print the traces listed (ProfileReply)."""
    from higgsfield.node.runs.profile import profile as _profile
    from higgsfield.node.state.records import RunDir

    rd = RunDir(_home(ctx), project, run_name)
    _emit(_profile(rd, steps=steps, ranks=ranks, memory=memory, timeout=timeout))


# The dashboard's node-side feeds (higgsfield/node/views.py): stats | metrics.
from higgsfield.node.views import metrics as _metrics  # noqa: E402
from higgsfield.node.views import stats as _stats  # noqa: E402

invoker.add_command(_stats)
invoker.add_command(_metrics)

# Data entries (higgsfield/node/data/cli.py, loaded by _Verbs when named): data status | missing | put | commit
# | serve | fetch | ingest | prune.


@invoker.command(hidden=True)
@click.option("--project", required=True)
@click.option("--run", "run_name", required=True)
@click.option("--step", default=None, help="Also list this complete step's files (name step_XXXXXXXX).")
@click.option("--logs", is_flag=True, help="The run directory's record and logs instead of the checkpoint.")
@click.pass_context
def files(ctx: click.Context, project: str, run_name: str, step: str | None, logs: bool) -> None:
    """(pull) List a run's checkpoint steps, or one step's files or its logs, with sizes and sha256."""
    from higgsfield.node.observe.files import describe

    _emit(describe(_home(ctx), project, run_name, step=step, logs=logs))


@invoker.command(hidden=True)
@click.option("--project", required=True)
@click.option("--dry-run", is_flag=True, help="Only list what a prune would remove.")
@click.pass_context
def prune(ctx: click.Context, project: str, dry_run: bool) -> None:
    """Remove finished runs (their checkpoints, unused images) as the policy on stdin says; prints what went.

    stdin: {"older_than_s", "keep_runs", "runs", "checkpoints", "images"} (empty: nothing selected).
    A bad request is one line on stderr, exit 2, nothing removed.
    """
    from dataclasses import replace

    from higgsfield.contract.prunespec import read_policy
    from higgsfield.node.runs.prune import PruneError
    from higgsfield.node.runs.prune import prune as _prune

    raw = sys.stdin.read().strip()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        raise PruneError("the prune request on stdin is not JSON") from None
    policy = read_policy(data)
    _emit(_prune(_home(ctx), project, replace(policy, dry_run=policy.dry_run or dry_run)))


@invoker.command(hidden=True)
@click.option("--project", required=True)
@click.pass_context
def usage(ctx: click.Context, project: str) -> None:
    """(doctor) Bytes in the state dir and the project's checkpoints, and the free space where they are."""
    from higgsfield.node.runs.prune import usage as _usage

    _emit(_usage(_home(ctx), project))
