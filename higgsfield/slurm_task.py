"""Shim: ``python -m higgsfield.slurm_task`` is in the batch scripts of Slurm jobs queued before an upgrade.

Kept until 0.3: the node side moved to :mod:`higgsfield.node` after 0.1.0, and nodes upgrade with runs in flight.
"""
from higgsfield.node.slurm_task import main

if __name__ == "__main__":
    raise SystemExit(main())
