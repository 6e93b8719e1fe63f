#!/usr/bin/env python3
"""The test bed's command line; the bed itself is the package beside this file, hftestbed/.

    python3 scripts/testbed/testbed.py up [--hosts N] [--no-docker] [--no-image] [--reset-homes]
    python3 scripts/testbed/testbed.py down [--purge]
    python3 scripts/testbed/testbed.py status
    python3 scripts/testbed/testbed.py start-host I | stop-host I | rekey-host I
    python3 scripts/testbed/testbed.py docker-group add|remove I
    python3 scripts/testbed/testbed.py env        # shell exports describing the bed

Run as a script, this file's directory is first on sys.path, so the package imports
by its name. The tests and the benches load the package by path instead
(tests/testbed.py, bench/_bed.py).
"""

import sys

from hftestbed.cli import main

if __name__ == "__main__":
    sys.exit(main())
