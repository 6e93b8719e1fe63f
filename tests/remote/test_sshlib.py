"""Importing the control side's SSH prints nothing, whatever cryptography warns about."""

from __future__ import annotations

import subprocess
import sys

import cryptography
import pytest


@pytest.mark.timeout(60)
def test_reaching_a_node_imports_asyncssh_without_a_word_on_stderr() -> None:
    # cryptography 51 deprecated DSA and asyncssh names DSA classes while it imports:
    # every command that reached a node printed ten warning lines above its answer.
    # -W always shows every warning the import would raise, once-per-place filters or not.
    code = "import higgsfield.control.remote.ssh, higgsfield.control.provision.trust, higgsfield.control.remote.fanout"
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


@pytest.mark.timeout(60)
def test_a_dsa_key_a_user_loads_still_warns() -> None:
    # The silence is for the import only, not a blanket filter on the process.
    code = (
        "import warnings\n"
        "import higgsfield.control.remote.ssh\n"
        "from cryptography.hazmat.primitives.asymmetric import dsa\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    dsa.DSAPrivateKey\n"
        "print(len(w))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr
    major = int(cryptography.__version__.split(".")[0])
    assert int(r.stdout) == (1 if major >= 51 else 0)
