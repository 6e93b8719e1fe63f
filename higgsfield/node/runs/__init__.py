"""A run's life on one node: start, supervise, stop, its record and its failure, prune."""
