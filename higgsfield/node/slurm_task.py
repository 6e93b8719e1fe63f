"""A Slurm run inside its allocation (node side): the batch step, and the one task ``srun`` starts per node.

The batch script (:mod:`higgsfield.control.backends.slurm.script`) runs, on the allocation's first node::

    python -m higgsfield.node.slurm_task batch RUN_DIR --master HOST0 -- srun ... python -m higgsfield.node.slurm_task node RUN_DIR --master HOST0

and, beside it, ``python -m higgsfield.node.slurm_task stacks RUN_DIR`` on every node for a stack.

``batch`` takes the run's secrets from ``RUN_DIR/secrets.json`` and deletes the file at
once (from then on they live only in the environment of the run's processes, as on an
SSH node; a run that may still recover from a lost node writes it back, 0600, for the
start Slurm makes by itself), records this start as an attempt of the run, pins the
control side's RunSpec to the allocation (its nodes, node 0, the rendezvous host) into ``spec.json``, picks the rendezvous port, writes ``run.json``
(running), runs the ``srun`` line, and writes the end: succeeded, killed (``scancel``
after the control side left a ``kill`` marker), or failed naming the first failing rank
and its node. With restarts left (``max_restarts``, the job was submitted with
``--requeue``) a failure writes the secrets file back (0600) and requeues the job with
``scontrol requeue``: Slurm starts it again from the top, and the run resumes from its
last checkpoint, which lives in the shared workdir. A node of the allocation that is gone
is no crash: the job is requeued without it (``max_recoveries``, :mod:`higgsfield.node.slurm_recovery`;
each end is :mod:`higgsfield.node.slurm_end`'s).

The batch step also watches the run for a stall while the ``srun`` line runs
(:mod:`higgsfield.node.slurm_stall`): at one, it takes every rank's stack through one
``stacks`` task per node, keeps the diagnosis in the record, and fails, requeues or
waits per the spec's ``on_stall``.

``stacks`` (one per node, started by ``srun --overlap --jobid JOB`` beside the running
step, from the batch step at a stall or from the login node for ``higgsfield stacks``)
prints that node's ranks' stacks as one JSON line.

``node`` (one per node, ``SLURM_NODEID`` its node rank) first compares the allocation's nodes
(:mod:`higgsfield.node.slurm_drift`: each writes its facts to the run directory, waits for the
others', compares): on a difference, unless the run allows drift, no torchrun starts and the
batch step records the run failed with one line per difference. Then it starts torchrun with the c10d
rendezvous on ``HOST0`` and each node's own host name as its address, so the group
ranks are the host names' sorted order; every worker logs to ``logs/rank<N>.log`` of the
shared run directory, the layout ``higgsfield invoker logs`` follows on an SSH node.

Node side: this module imports nothing of the control side (``.importlinter``); the
file names it shares with :mod:`higgsfield.control.backends.slurm.layout` are checked equal by the tests.

This module is the program a job script names (its module path is in every queued job's
argv, so it cannot move without a shim). The run's files that its three roles share (the
request, the secrets, the record, a start failure) are :mod:`~higgsfield.node.slurm_run`;
what each role does beyond that lives in :mod:`~higgsfield.node.slurm_stall`,
:mod:`~higgsfield.node.slurm_drift`, :mod:`~higgsfield.node.slurm_end` and :mod:`~higgsfield.node.slurm_recovery`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace

from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.layout import KILL, SECRETS
from higgsfield.contract.names import check_node_name
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.slurmjob import (
    PinnedSlurmRun,
    SlurmRequest,
    decode_pinned,
    pinned_json,
)
from higgsfield.contract.states import FAILED, KILLED, RUNNING, SUCCEEDED
from higgsfield.node import slurm_drift, slurm_end, slurm_recovery
from higgsfield.node.runtime.env import kept_basics, run_variables
from higgsfield.node.slurm_end import Start
from higgsfield.node.slurm_run import (
    PORT_VAR,
    SECRET_NAMES_VAR,
    BadRequest,
    TaskError,
    now,
    put_secrets_back,
    read_record,
    read_request,
    run_dir,
    start_failed,
    take_secrets,
    write_record,
)
from higgsfield.node.slurm_stall import StallWatch, node_stacks, take_all, watch
from higgsfield.node.state.placement import SPEC_MAX_BYTES, STOP_GRACE_S
from higgsfield.node.state.records import RunDir, RunRecord, write_json

SLURM_KEPT_ENV = ("CUDA_VISIBLE_DEVICES",)   # Slurm's own, for the job's GPUs; kept beside the runtimes' basics


# -- batch: on the first node of the allocation ---------------------------------------------

def hostnames() -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],  # noqa: S607
                         capture_output=True, text=True, check=True).stdout
    return [h for h in out.split() if h]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def pin_spec(req: SlurmRequest, hosts: list[str], master: str) -> RunSpec:
    """The control side's spec, pinned to this allocation: its nodes in SLURM_NODEID order, node 0's view."""
    template = req.spec
    return template.replace(nodes=tuple(hosts), node=hosts[0], node_rank=0, master_addr=master,
                            nproc=template.nproc or max(1, req.gpus_per_node))


def batch(rd: RunDir, master: str, command: list[str]) -> int:
    """The batch step: see the module's docstring. Returns the job's exit status."""
    try:
        req = read_request(rd)   # TaskError (unreadable, another version's): main says so, nothing recorded
    except BadRequest as e:      # a field of it is wrong: a start failure, its secrets gone with it
        (rd.path / SECRETS).unlink(missing_ok=True)
        return start_failed(rd, None, str(e))
    job_id = os.environ.get("SLURM_JOB_ID", "")
    since = now()
    try:
        secrets = take_secrets(rd, req.secret_names)
        hosts = hostnames()
        spec = pin_spec(req, hosts, master)
    except (TaskError, subprocess.CalledProcessError, ValueError) as e:
        return start_failed(rd, req.spec, str(e))
    rd.make()
    write_json(rd.spec_path, pinned_json(PinnedSlurmRun(spec, gpus=req.gpus_per_node, checkpoint_dir=req.checkpoint_dir,
                                                        cache_dir=req.cache_dir, python=sys.executable,
                                                        allow_drift=req.allow_drift)))
    previous = read_record(rd)
    attempt = slurm_recovery.begin(rd, previous, hosts, int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    attempts = [*(previous.attempts if previous else []), attempt]
    start = Start(job_id, spec, req.max_restarts, slurm_recovery.restarts(attempts),
                  slurm_recovery.recoveries(attempts), secrets, tuple(hosts))
    record = RunRecord(project=spec.project, experiment=spec.experiment, run=spec.run, node=hosts[0], node_rank=0,
                       nnodes=len(hosts), nproc=spec.nproc or 1, state=RUNNING, runtime="slurm", command=command,
                       created_at=previous.created_at if previous else (req.submitted_at or since),
                       started_at=since, reason=f"Slurm job {job_id}" + (f", {attempt.why}" if attempt.number > 1
                                                                         else ""),
                       stall=previous.stall if previous else None,           # a stall before a requeue is kept
                       stalled_at=previous.stalled_at if previous else None, attempts=attempts,
                       lost=[*(previous.lost if previous else []),
                             *(n for n in attempt.lost if not previous or n not in previous.lost)])
    if start.recoveries > spec.max_recoveries:   # Slurm started it again after one loss too many
        record.ended_at, record.exit_code = now(), 1
        return slurm_end.lost(rd, record, dict.fromkeys(attempt.lost, "lost"),
                              replace(start, recoveries=start.recoveries - 1), 1)
    write_record(rd, record)
    if start.may_recover:
        put_secrets_back(rd, secrets)   # a start Slurm makes by itself (a lost batch node) needs them too
    env = dict(os.environ)
    env.update(secrets)
    # ephemeral on purpose, not contract.ports.free_port's rendezvous range (named by SSH nodes' firewall rules)
    env[PORT_VAR] = str(free_port())
    env[SECRET_NAMES_VAR] = ",".join(sorted(secrets))
    stopped: list[int] = []
    proc = subprocess.Popen(command, env=env)  # noqa: S603 - the batch script's own srun line

    def on_signal(sig: int, _frame: object) -> None:
        stopped.append(sig)
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    python = sys.executable
    watcher = StallWatch(rd, spec, since, lambda: take_all(job_id, hosts, python, rd))
    stall = watch(proc, watcher, stop=lambda: _stop(proc), running_reason=record.reason)
    rc = proc.wait()
    record = rd.read()
    record.ended_at, record.exit_code = now(), rc
    killed = (rd.path / KILL).exists()
    gone = {} if killed or stopped or (rc == 0 and stall is None) else \
        slurm_recovery.lost_nodes(job_id, hosts, this_node())
    if gone:   # a node of the allocation is lost (its ranks' peers failed or hung): a recovery's business
        return slurm_end.lost(rd, record, gone, start, rc)
    if stall is not None and not killed:
        return slurm_end.stalled(rd, record, stall, watcher.policy.on_stall, start, rc)
    if stopped or killed:
        record.state = KILLED if killed else FAILED
        record.reason = "killed (scancel)" if killed else \
            "Slurm stopped the job (time limit, preemption, or a node failure)"
        write_record(rd, record)
        if killed or not start.may_recover:   # else Slurm may start it again (a lost node): it needs them
            slurm_end.final(rd)
        return rc or 1
    if rc == 0:
        record.state, record.reason = SUCCEEDED, None
        write_record(rd, record)
        slurm_end.final(rd)
        return 0
    drift = [] if req.allow_drift else slurm_drift.verdict(rd, attempt_id())
    if drift:   # the nodes differ: stopped before training; a requeue would meet the same nodes' differences
        record.state, record.reason, record.error_tail = FAILED, slurm_drift.reason(drift), slurm_drift.lines(drift)
        try:
            record.failed_node = check_node_name(drift[0].node)
        except ValueError:
            record.failed_node = None
        write_record(rd, record)
        slurm_end.final(rd)
        return rc
    fail = slurm_end.failure(rd, hosts, spec.nproc or 1, rc, since)
    record.failed_node, record.failed_rank, record.failed_at = fail.node, fail.rank, fail.at
    record.error_tail = list(fail.tail)
    return slurm_end.ended(rd, record, fail.reason, start.restarts < req.max_restarts and bool(job_id), start, rc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the job's step at once (srun, told SIGTERM, ends every node's task and their torchruns)."""
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass


# -- node: one per node, started by srun -----------------------------------------------------

def torchrun_argv(spec: RunSpec, rd: RunDir, master: str, port: int, host: str, rdzv_id: str) -> list[str]:
    """torchrun with the c10d rendezvous on ``master:port``; this node named ``host`` (its group rank's order:
    unlike :func:`higgsfield.node.runtime.torchrun.argv`'s static rendezvous, c10d orders the nodes itself)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(spec.nnodes),
        "--nproc_per_node", str(spec.nproc),
        "--rdzv_backend", "c10d",
        "--rdzv_endpoint", f"{master}:{port}",
        "--rdzv_id", rdzv_id,
        "--local_addr", host,
        "--max_restarts", "0",
        "-m", "higgsfield.node.entrypoint", str(rd.path),
    ]


def node_env(pinned: PinnedSlurmRun, rd: RunDir, host: str, base: dict[str, str]) -> dict[str, str]:
    """A minimal environment: the basics of ``base``, the run's secrets (named in it), the run's own variables
    (:mod:`higgsfield.node.runtime.env`, as an SSH node's; ``host`` this node, the mirror's credentials secrets)."""
    env = kept_basics(base, also=SLURM_KEPT_ENV)
    for name in filter(None, base.get(SECRET_NAMES_VAR, "").split(",")):
        if name in base:
            env[name] = base[name]
    spec = pinned.spec
    env.update(run_variables(project=spec.project, experiment=spec.experiment, run=spec.run, run_dir=str(rd.path),
                             node=host, checkpoint_dir=pinned.checkpoint_dir,
                             checkpoint_mirror=spec.checkpoint_mirror))
    from higgsfield.node.data.store import data_variables

    env.update(data_variables(rd.home, spec.project))   # data push put them in the shared workdir, once
    return env


def attempt_id() -> str:
    """This start of the job, ``JOB.RESTART``: its rendezvous id, and the folder of its nodes' facts."""
    return f"{os.environ.get('SLURM_JOB_ID', 'job')}.{os.environ.get('SLURM_RESTART_COUNT') or 0}"


def drift_check(rd: RunDir, pinned: PinnedSlurmRun, host: str) -> bool:
    """The allocation's nodes compared (:mod:`higgsfield.node.slurm_drift`), each difference one line in the
    job's log; False: they differ and the run was not started with ``--allow-drift``."""
    report = slurm_drift.check(rd, attempt_id(), list(pinned.spec.nodes), host)
    for node_name, why in report.unreachable.items():
        print(f"higgsfield: drift check: {node_name} {why}; compared the others", file=sys.stderr, flush=True)
    allowed = pinned.allow_drift
    for d in report.differences:
        print(f"higgsfield: {host}: drift: {d.line()}" + (" (allowed: --allow-drift)" if allowed else ""),
              file=sys.stderr, flush=True)
    return allowed or not report.differences


def node(rd: RunDir, master: str) -> int:
    """This node's torchrun, until it ends; SIGTERM (scancel) stops it and its workers. The nodes are compared
    first: on a difference (without ``--allow-drift``) no torchrun starts and the task exits DRIFT_EXIT."""
    try:   # the spec.json the batch step pinned, decoded once
        pinned = decode_pinned(read_json(rd.spec_path, limit=SPEC_MAX_BYTES), where=str(rd.spec_path))
    except (OSError, DecodeError) as e:
        raise TaskError(f"cannot read the run's pinned spec: {e}") from None
    host = pinned.spec.nodes[int(os.environ.get("SLURM_NODEID", "0"))]
    if not drift_check(rd, pinned, host):
        return slurm_drift.DRIFT_EXIT
    argv = torchrun_argv(pinned.spec, rd, master, int(os.environ[PORT_VAR]), host, attempt_id())
    proc = subprocess.Popen(argv, env=node_env(pinned, rd, host, dict(os.environ)),  # noqa: S603
                            cwd=pinned.spec.code_dir or str(rd.path))
    stopping: list[float] = []

    def on_signal(sig: int, _frame: object) -> None:
        stopping.append(now())
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if stopping and now() - stopping[0] > STOP_GRACE_S:
                proc.kill()  # its workers die with it (PR_SET_PDEATHSIG)


def this_node() -> str:
    """This compute node's Slurm name (what ``scontrol show hostnames`` lists and the spec's nodes say)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


# -- command line ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    cut = args_in.index("--") if "--" in args_in else len(args_in)
    command = args_in[cut + 1:]   # the batch step's srun line, verbatim
    parser = argparse.ArgumentParser(prog="python -m higgsfield.node.slurm_task")
    parser.add_argument("role", choices=["batch", "node", "stacks"])
    parser.add_argument("run_dir")
    parser.add_argument("--master")
    args = parser.parse_args(args_in[:cut])
    rd = run_dir(args.run_dir)
    if args.role == "stacks":   # under `srun --overlap --jobid`: this node's ranks' stacks, one JSON line
        print(node_stacks(rd, this_node()), flush=True)
        return 0
    if not args.master:
        parser.error(f"{args.role} needs --master HOST")
    try:
        if args.role == "batch":
            if not command:
                parser.error("batch needs the srun command after --")
            return batch(rd, args.master, command)
        return node(rd, args.master)
    except TaskError as e:
        print(f"higgsfield: {e}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
