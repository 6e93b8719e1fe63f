"""One error hierarchy for everything a user can get wrong or a node can do wrong.

Every exception class higgsfield raises for a user is in this tree. A class defined in another
module (in parentheses, under ``higgsfield.``) stays beside the code that raises it, and its callers
import it from there; it subclasses a class of this module, which, being in the stdlib-only
contract, every side may import.

    HiggsfieldError                 base; ``exit_code`` is what the CLI exits with
    ├── ConfigError                 higgsfield.yml / env file is invalid (exit 2)
    ├── ExperimentError             bad @experiment/@param, unknown experiment (exit 2)
    │   ├── ParamError              a param value is missing, mistyped or not an option (exit 2)
    │   └── DiLoCoError             (_lib.diloco) a DiLoCo option that cannot work: H < 1, an unknown
    │                               quantization, one node (also a ValueError; the worker exits 2)
    ├── ScaffoldError               ``higgsfield init`` refused (exit 2)
    ├── RemoteError                 a node could not be reached or a command failed
    │   ├── ConnectError            connect/auth failed or timed out
    │   ├── HostKeyError            the node's host key does not match the pinned one
    │   │   └── HostNotPinnedError  the node has no pinned key (only ``higgsfield setup`` pins one)
    │   └── CommandError            a remote command exited non-zero or timed out
    ├── GroupError                  a fan-out step failed on some nodes; holds every result
    ├── StepFailed                  a setup step found a problem it cannot fix
    ├── WheelError                  the nodes' higgsfield wheel could not be built or chosen
    ├── DeployError                 deploy could not ship the code or build the environment
    ├── CheckpointError             a checkpoint could not be saved or loaded (every rank alike)
    ├── UIError                     ``higgsfield ui`` cannot serve (port taken or invalid, extra missing) (exit 2)
    ├── DataError                   (contract.data) a data entry cannot be pushed as asked: a missing path,
    │   │                           a file that changed during the push, no space on a node (exit 2)
    │   └── Stopped                 (node.data.peer) a waiting peer server's push is gone: the server ends
    └── RunError                    a run is unknown, failed to launch, or failed
        ├── NoSuchRun               no run or experiment has the name given (exit 2: the user's to fix)
        ├── RunNameInUse            a start refused: the name belongs to an active run, left untouched (exit 2)
        ├── NodeLost                a followed run's log stream of one node could not be re-attached
        ├── SpecError               (contract.runspec) a run spec a node cannot accept: another version,
        │                           a malformed field (exit 2)
        ├── PruneError              (contract.prunespec) a prune request a node cannot read (exit 2)
        ├── NodesDrift              (contract.drift) ``run`` refused: the nodes differ (exit 2)
        ├── RecordError             (node.state.records) a run's record that does not decode; also a
        │                           DecodeError, for the readers that skip it
        ├── TaskError               (node.slurm_run) a Slurm job cannot run as asked: its request
        │   │                       unreadable or another version's, its secrets gone (the job exits 2)
        │   └── BadRequest          (node.slurm_run) a field of the request is wrong: the job's start failure
        ├── NotEnoughNodes          (control.backends.pick) fewer healthy nodes than ``--nodes K`` (exit 2)
        ├── NoStacks                (control.backends.backend) ``stacks`` of a run with none to show (exit 2)
        ├── ProfileError            (control.backends.nodes.profile) ``profile`` of a run not running, unknown,
        │                           or without that node (exit 2)
        ├── NotProfiled             (node.runs.profile) ``invoker profile`` of a run not running here (exit 2)
        ├── PullError               (control.backends.nodes.pull) a step not complete everywhere, a bad
        │                           ``--step`` (exit 2)
        ├── PruneRefused            (control.backends.nodes.prune) a prune that would touch an active run,
        │                           or selects nothing (exit 2)
        ├── SlurmError              (control.backends.slurm.client) Slurm refused or failed an operation
        │   └── SlurmRefused        (control.backends.slurm.client) sbatch refused the job as asked (exit 2)
        ├── FabricFailed            (control.doctor.fabric) ``doctor --fabric``'s benchmark gave no result
        └── ExportError             (_lib.hf_export) a step that cannot be exported, a missing package (exit 2)

Internal: these never reach a user, so they stay outside the tree (each is caught where it is
raised, or one layer up, and turned into a tree error, a skipped item or a reply):

    DecodeError     (contract.decode) the decode mechanism's one-line reason; every reader turns it into
                    a skip line, a tree error (SpecError, RecordError, SlurmError, TaskError, ...) or a
                    reply. A ValueError, as the decoders' callers expect.
    WrongVersion    (contract.slurmjob) a DecodeError: a Slurm file of another version; the Slurm task
                    turns it into a TaskError, the control side into a SlurmError
    WrongValue      (contract.values) a value of the wrong type inside the codec; it adds the path and
                    raises a DecodeError
    WireError       (node.gang.wire) a peer broke the gang protocol or went away; the coordinator,
                    member and supervisor turn it into a lost node: the run's failure, on record
    Misplaced       (control.config.fields) a ValueError inside a pydantic model validator that belongs to
                    one field (min_nodes past the nodes listed); pydantic wraps it and the loader raises
                    a ConfigError naming that field's line
    NodeDup         (control.config.schema) a Misplaced: a node listed twice, at the second entry's line
    BadBody         (control.ui.app) a request body the dashboard does not take; answered as its 4xx
    _Down           (control.backends.nodes.fleet) a node's dashboard feed ended; the feed is tried again
    _ClosedPipe     (control.cli) stdout closed by its reader, carried past click to exit quietly

The CLI catches ``HiggsfieldError`` and prints ``str(err)`` as one line; ``--debug``
shows the traceback. Messages name the file, field or node and say what to do.
tests/test_architecture.py checks that every exception class in higgsfield is in this tree or
internal, and named here.
"""

from __future__ import annotations

from typing import Any


class HiggsfieldError(Exception):
    """Base of every error higgsfield raises on purpose."""

    exit_code = 1


class ConfigError(HiggsfieldError):
    exit_code = 2


class ExperimentError(HiggsfieldError):
    exit_code = 2


class ParamError(ExperimentError):
    pass


class ScaffoldError(HiggsfieldError):
    exit_code = 2


class RemoteError(HiggsfieldError):
    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node
        self.reason = message


class ConnectError(RemoteError):
    pass


class HostKeyError(RemoteError):
    pass


class HostNotPinnedError(HostKeyError):
    """No key is pinned for the node: every command but ``higgsfield setup`` refuses it (setup asks first)."""


class CommandError(RemoteError):
    def __init__(self, node: str, message: str, exit_status: int | None = None,
                 stdout: str = "", stderr: str = "") -> None:
        super().__init__(node, message)
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr


class GroupError(HiggsfieldError):
    """Raised by a fan-out when some nodes failed; ``results`` holds every node's result."""

    def __init__(self, message: str, results: Any) -> None:
        super().__init__(message)
        self.results = results


class RunError(HiggsfieldError):
    pass


class NoSuchRun(RunError):
    """A run or experiment name that names no run: a mistyped argument, like any bad input."""

    exit_code = 2


class RunNameInUse(RunError):
    """A start refused because the run name belongs to a queued, starting or running run (exit 2).

    The run holding the name is never touched by the refusal; the message says how to
    follow or stop it, or to pick another name. ``nodes`` names where it was found.
    """

    exit_code = 2

    def __init__(self, run: str, state: str, nodes: str, detail: str = "") -> None:
        super().__init__(f"run '{run}' is already {state} on {nodes}: follow it with 'higgsfield logs -f {run}', "
                         f"stop it with 'higgsfield kill {run}', or pick another --run-name{detail}")
        self.run = run
        self.state = state
        self.nodes = nodes


class UIError(HiggsfieldError):
    """The dashboard cannot start: its port is taken or out of range, its host does not resolve, or the
    ``ui`` extra (starlette, uvicorn) is not installed. The message says what to do."""

    exit_code = 2


class StepFailed(HiggsfieldError):
    """A step's check, apply or verify found a problem it cannot fix; the message says what to do."""


class WheelError(HiggsfieldError):
    pass


class DeployError(HiggsfieldError):
    pass


class CheckpointError(HiggsfieldError):
    """A checkpoint could not be saved or loaded; raised on every rank alike.

    ``failures`` maps each failing rank to what it reported (``"OSError: [Errno 28]
    No space left on device: ..."``). The message names the directory, the first
    failing rank and the last complete checkpoint, which a save failure leaves intact.
    """

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


class NodeLost(RunError):
    """A node's log stream of a followed run broke and could not be re-attached (the run is not touched)."""

    def __init__(self, node: str, reason: str, run: str = "") -> None:
        super().__init__(f"lost the log stream of node {node}{f' (run {run})' if run else ''}: {reason}; "
                         "whether the run goes on is up to its nodes (see 'higgsfield status')")
        self.node = node
        self.reason = reason
        self.run = run
