"""The Slurm backend (control side): a run is one batch job on a cluster reached through its login node.

What the cluster is and what a run asks of it is higgsfield.yml's ``slurm:`` block itself, as config
loading typed and checked it (:class:`~higgsfield.control.config.slurm.SlurmConfig`). Here:

- :mod:`~higgsfield.control.backends.slurm.layout`: where a run's files live in the shared workdir;
- :mod:`~higgsfield.control.backends.slurm.script`: the batch script (``#SBATCH`` lines, one ``srun`` task per node);
- :mod:`~higgsfield.control.backends.slurm.states`: Slurm's job states as run states;
- :mod:`~higgsfield.control.backends.slurm.client`: submit, query, cancel through the login node (:class:`SlurmCluster`);
- :mod:`~higgsfield.control.backends.slurm.parse`: squeue's and sacct's answers as :class:`Job`, sbatch's reason;
- :mod:`~higgsfield.control.backends.slurm.runstatus`: a run's status merged from Slurm's view and the job's record;
- :mod:`~higgsfield.control.backends.slurm.listing`: the script that lists a project's runs on the login node;
- :mod:`~higgsfield.control.backends.slurm.machines`: the partition's compute nodes as ``sinfo -N`` sees them (the dashboard's);
- :mod:`~higgsfield.control.backends.slurm.backend` and :mod:`~higgsfield.control.backends.slurm.session`: the
  :class:`~higgsfield.control.backends.backend.Backend` / ``Session`` pair;
- :mod:`~higgsfield.control.backends.slurm.fleet`: the dashboard's view (the login node asked every few seconds);
- :mod:`~higgsfield.control.backends.slurm.pull`: ``higgsfield pull`` through the login node;

Inside the allocation the node side takes over: :mod:`higgsfield.node.slurm_task`, and its stall
watchdog :mod:`higgsfield.node.slurm_stall`. Stdlib and
the control side's own packages only, never torch.
"""

from __future__ import annotations

from higgsfield.control.backends.slurm.client import (
           SlurmCluster,
           SlurmError,
           SlurmRefused,
           Submitted,
           template_spec,
)
from higgsfield.control.backends.slurm.machines import ClusterNode
from higgsfield.control.backends.slurm.parse import Job

__all__ = ["ClusterNode", "Job", "SlurmCluster", "SlurmError", "SlurmRefused", "Submitted", "template_spec"]
