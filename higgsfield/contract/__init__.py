"""The contract both sides read: what crosses from the laptop to a node and back, stdlib only.

The run spec, node records and status (:mod:`.runspec`; one node's part of a run's status,
:mod:`.nodepart`), the dashboard's node feed (:mod:`.feed`), a run's failure and the
coordinator's verdict (:mod:`.failure`), the run directory's names (:mod:`.layout`),
a Slurm run's request, submission and pinned-spec files (:mod:`.slurmjob`), every invoker verb's
reply (:mod:`.replies`, :mod:`.replies_disk`), the prune request
(:mod:`.prunespec`), the defensive decoder every reader goes through
(:mod:`.decode`), the error tree (:mod:`.errors`), and the small vocabularies both
sides check the same way: names, params, ports, units, text and Slurm syntax.
It imports nothing else of higgsfield and no third-party package (``.importlinter``),
so the control side, the node side and the training library can all depend on it.
"""
