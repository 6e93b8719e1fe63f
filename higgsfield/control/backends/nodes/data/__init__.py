"""``higgsfield data push`` on SSH nodes: the laptop's manifests (manifest), the push (push), the nodes'
copies among themselves (fanout), and the checks ``run`` and ``doctor`` make of what the nodes hold (check)."""
