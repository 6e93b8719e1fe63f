"""What requirements.txt names, read as pip reads it (higgsfield.node.code.env_key.lists).

Deploy adds torch (and numpy) to a project venv only when requirements.txt names
none itself; a wrong answer either installs a second torch over the user's pinned
build or leaves the venv without one.
"""

from __future__ import annotations

import pytest

from higgsfield.node.code.env_key import added, lists

NAMES_TORCH = ["torch", "Torch==2.6.0", "torch==2.6.0+cu124", "torch @ https://example.org/torch-2.6-cp311.whl",
               "torch==2.6.0 --hash=sha256:0123abcd", "torch>=2.4; python_version >= '3.10'",
               "  torch  # pinned for the cluster", "TORCH[opt-einsum]==2.6"]
NAMES_NO_TORCH = ["torchvision==0.21", "git+https://example.org/torch.git", "./vendor/torch", "-r torch.txt",
                  "--extra-index-url https://download.pytorch.org/whl/cu124", "# torch", "pytorch-lightning",
                  "torch_geometric"]


@pytest.mark.parametrize("line", NAMES_TORCH)
def test_a_line_naming_torch_is_seen(line: str) -> None:
    assert lists(f"numpy\n{line}\n", "torch")
    assert added(f"{line}\n") == ["numpy"]


@pytest.mark.parametrize("line", NAMES_NO_TORCH)
def test_a_line_that_names_no_torch_is_not_taken_for_it(line: str) -> None:
    assert not lists(f"{line}\n", "torch")
    assert added(f"{line}\n")[0] == "torch"


def test_names_compare_canonicalised() -> None:
    assert lists("Flash_Attn==2.6\n", "flash-attn") and lists("flash.attn\n", "FLASH_ATTN")
