"""How a run's torchrun is started: as plain processes, or in a Docker container."""
