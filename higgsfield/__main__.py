"""``python -m higgsfield`` is the ``higgsfield`` command."""

from higgsfield.control.cli import main

main()
