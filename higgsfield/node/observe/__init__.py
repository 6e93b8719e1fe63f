"""What a node shows of its runs: logs and their time index, metrics, machine samples, live feed, files."""
