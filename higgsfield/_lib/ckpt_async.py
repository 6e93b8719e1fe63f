"""A checkpoint written in the background that never keeps a failing rank from exiting.

Used by :func:`higgsfield._lib.ckpt_shards.save_shards` for ``Checkpoint(async_save=True)``:
the same staging (a CPU copy of every tensor, taken now) and the same ``dcp.save`` on the
save's own gloo group as ``torch.distributed.checkpoint.async_save``, but in a daemon thread.

Why not DCP's ``async_save``: it writes in a ``ThreadPoolExecutor`` worker, and the
interpreter's exit joins those (``concurrent.futures`` hooks ``threading``'s shutdown, which
:func:`higgsfield.node.entrypoint.leave` runs too). When a rank dies with a save in flight,
a survivor whose training collective failed then cannot exit: its save thread waits in a
collective of the save's group for a peer that is alive, and that peer waits for this rank in
a training collective. Neither exits, so neither node's torchrun sees a worker fail and none
restarts (2 nodes x 2 ranks, a worker killed mid-save: hybrid sharding hung in 7 of 11 tries,
full sharding about 1 in 5; the survivors' stacks: ``_python_exit`` joining the save thread in
``gather_object``, the other rank in the loss's ``all_reduce``). A daemon thread is joined by
nothing: the failing rank exits at once, its sockets close, and every collective that waits
for it fails at once, so the failure reaches every rank instead of a wait.

Nothing here decides that a save is complete: the thread writes only into the save's
``.tmp-step_*`` directory, and :meth:`higgsfield.checkpoint.Checkpoint.wait` writes the marker
and renames it on the main thread once every rank's write is known to have worked. A save
abandoned by a rank that exits is left as a ``.tmp-*``, never loaded, removed by the next save.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

__all__ = ["save_in_background"]


def save_in_background(state: dict[str, Any], group: Any, **kw: Any) -> Future[Any]:
    """Copy ``state``'s tensors now, then ``dcp.save`` the copy on ``group`` in a daemon thread.

    ``kw``: ``dcp.save``'s ``checkpoint_id``, or ``storage_writer`` and ``planner``. Returns the
    future of DCP's metadata (its exception if the save failed on any rank).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

    writer = kw.get("storage_writer")
    # what async_save stages with: a writer that stages itself (FileSystemWriter does), else a default stager
    stager = writer if isinstance(writer, AsyncStager) else DefaultStager(StagingOptions(False, False, False, False))
    staged = stager.stage(state)
    if stager.should_synchronize_after_execute:
        stager.synchronize_staging()
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()

    def write() -> None:
        try:
            future.set_result(dcp.save(staged, process_group=group, **kw))
        except BaseException as e:  # noqa: BLE001 - the future carries it to Checkpoint.wait on the main thread
            future.set_exception(e)
        finally:
            if stager is not writer:
                stager.close()

    threading.Thread(target=write, name="higgsfield-checkpoint-save", daemon=True).start()
    return future
