"""Shim: ``python -m higgsfield.entrypoint`` is in the argv of workers that torchrun restarts across an upgrade.

Kept until 0.3: the node side moved to :mod:`higgsfield.node` after 0.1.0, and nodes upgrade with runs in flight.
"""
from higgsfield.node.entrypoint import main

if __name__ == "__main__":
    raise SystemExit(main(hard_exit=True))
