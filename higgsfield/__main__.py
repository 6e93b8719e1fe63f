"""``python -m higgsfield`` is the ``higgsfield`` command."""

from higgsfield.cli import main

main()
