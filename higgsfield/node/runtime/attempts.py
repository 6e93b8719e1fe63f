"""Each torchrun attempt gets a key space of its own in the run's rendezvous store.

Why: a run on the SSH backend uses torchrun's *static* rendezvous (``--master_addr``,
``--master_port``, ``--node_rank``), so the node ranks are ours, in the order of the run's
nodes, and each node finds its own part of a node-local checkpoint again. With it every
worker of every attempt reaches the same TCPStore, the one node 0's torchrun agent hosts
for the whole run, and ``init_process_group`` keys that store by the process group's name
alone. After torchrun restarts the workers (``--max-restarts``) the new ones read the
addresses the dead ones left there, and gloo's ``connectFullMesh`` hangs or is refused.
torch assumes a fresh store per attempt, which holds for its c10d rendezvous only
(``torch.distributed.rendezvous._create_c10d_store``: "We create a new TCPStore for every
retry").

So before user code runs, a restarted worker wraps the ``env://`` rendezvous (the default
``init_method``, whichever way the experiment initialises) so that the store it yields is
prefixed by the attempt (``TORCHELASTIC_RESTART_COUNT``). The first attempt, a run whose
workers host their own store, and any other ``init_method`` see torch exactly as it is.
torch offers no public way to replace a registered handler, so this writes its table.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any


def isolate_restart_store(environ: Mapping[str, str] = os.environ) -> bool:
    """Prefix the ``env://`` store with this attempt's number when this worker is a restart on the agent's store."""
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0") or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    import importlib

    from torch.distributed import PrefixStore

    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module: the package's name is a function
    handlers: dict[str, Any] = rdzv._rendezvous_handlers  # noqa: SLF001 - no public way to replace one
    original = handlers.get("env")
    if original is None or getattr(original, "higgsfield_attempt", None) is not None:
        return False

    def per_attempt(url: str, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        for store, rank, world_size in original(url, **kwargs):
            yield PrefixStore(f"higgsfield/attempt{attempt}", store), rank, world_size

    per_attempt.higgsfield_attempt = attempt  # type: ignore[attr-defined]
    handlers["env"] = per_attempt
    return True
