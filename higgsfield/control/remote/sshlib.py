"""asyncssh, imported once and quietly: the one place the control side imports it at run time.

cryptography 51 deprecates DSA, and asyncssh names the DSA classes in type hints
while it imports, so every command that reaches a node printed ten lines of
``CryptographyDeprecationWarning`` above its own one-line answer. The warning
is about the libraries, not about anything the user did or can fix (higgsfield
never offers or accepts a DSA key), so it is silenced here, for this import
only: a DSA key a user does load still warns.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", category=UserWarning)
    import asyncssh

__all__ = ["asyncssh"]
