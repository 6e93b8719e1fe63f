"""The control side: everything that runs on the user's laptop or in a GitHub Actions job.

- :mod:`.cli`: thin click commands (the ``higgsfield`` program);
- :mod:`.ui`: the dashboard, a view beside the CLI;
- :mod:`.backends`: where runs happen, behind one ``Backend`` / ``Session`` seam
  (:mod:`.backends.nodes` for SSH nodes, :mod:`.backends.slurm` for a Slurm cluster);
- :mod:`.doctor`, :mod:`.provision`, :mod:`.workflows`, :mod:`.project`: diagnosis,
  node setup, the Actions workflows, and the user's project (scaffold, discovery);
- :mod:`.config`, :mod:`.secrets`, :mod:`.remote`: higgsfield.yml, secret values,
  and the SSH / local fan-out everything above goes through.

Imports run downward in that list; none reaches the node side (``.importlinter``).
"""
