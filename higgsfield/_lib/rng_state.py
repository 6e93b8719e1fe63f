"""Each rank's random number generators, saved as plain data and restored without unpickling.

Used by :class:`higgsfield.checkpoint.Checkpoint` for ``rng_rank<r>.pt``. Its own
module because a checkpoint can come from a shared place (a mirror, a pull), so
loading one must not run code: the file holds only ints, floats, lists, dicts and
tensors, and is read with ``torch.load(..., weights_only=True)``, which refuses
anything else. What is in it (``FORMAT`` 1)::

    {"format": 1,
     "python": {"version": int, "state": [625 ints], "gauss_next": float | None},   # random.getstate()
     "torch": uint8 tensor,                                                           # torch.get_rng_state()
     "cuda": uint8 tensor,                                                            # where CUDA is available
     "numpy": {"keys": uint32 tensor, "pos": int, "has_gauss": int, "cached_gaussian": float}}

A file that does not load that way (an older checkpoint's pickled state, or a
pickle planted on a mirror) is never executed: :func:`load_rng_state` says so in
one line naming the file and the rank goes on with its generators as they are;
the model, optimizer and step still resume.

What a checkpoint load still trusts: DCP's own ``.metadata`` is a pickle
(torch.distributed.checkpoint reads it with :mod:`pickle`), and DeepSpeed reads
its own files with ``weights_only=False``; ``trainer.pt`` and the ``.distcp``
values are read with ``weights_only=True``.
"""

from __future__ import annotations

import pickle
import random
import sys
import warnings
from pathlib import Path
from typing import Any, TypeGuard

import torch

__all__ = ["FORMAT", "load_rng_state", "rng_state", "set_rng_state"]

FORMAT = 1


def rng_state() -> dict[str, Any]:
    """This process's generators as plain data (the layout in the module docstring)."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {"format": FORMAT,
                             "python": {"version": int(version), "state": [int(x) for x in internal],
                                        "gauss_next": gauss_next},
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    if kind == "MT19937":
        state["numpy"] = {"keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).copy()), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return state


def set_rng_state(state: Any) -> None:
    """Restore what :func:`rng_state` returned; on anything else raise, with every generator as it was."""
    decoded = _decode(state)
    before = _decode(rng_state())
    try:
        _apply(*decoded)
    except Exception:
        _apply(*before)  # a value the generators refuse (a wrong length): none is left half restored
        raise


def _apply(python: tuple[Any, ...], cpu: torch.Tensor, cuda: torch.Tensor | None,
           np_state: tuple[Any, ...] | None) -> None:
    random.setstate(python)
    torch.set_rng_state(cpu)
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)
    if np_state is not None:
        import numpy as np
        np.random.set_state(np_state)


def load_rng_state(path: Path) -> bool:
    """Restore the generators from ``path`` without unpickling; True if restored.

    False, with one line on stderr naming the file, when it is not plain data in
    this format (an older checkpoint's pickled state, a planted pickle, a damaged file).
    """
    try:
        with warnings.catch_warnings():  # torch's own notes on an odd pickle: the line below says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
        set_rng_state(state)
    except pickle.UnpicklingError:  # weights_only met something that is not plain data: nothing was built
        reason = "it does not load with weights_only=True: not plain data"
    except Exception as e:  # noqa: BLE001 - any file that is not our plain data is skipped, never executed
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
    else:
        return True
    print(f"higgsfield: warning: RNG state not restored from {path} ({reason}); this rank goes on with its "
          "generators as they are (an older checkpoint's pickled RNG state is never unpickled)",
          file=sys.stderr, flush=True)
    return False


def _decode(state: Any) -> tuple[tuple[Any, ...], torch.Tensor, torch.Tensor | None, tuple[Any, ...] | None]:
    """Check every field before anything is set: a bad file must not leave the generators half restored."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"not an RNG state of format {FORMAT}")
    py = state.get("python")
    if not isinstance(py, dict) or not isinstance(py.get("version"), int) or not _ints(py.get("state")) \
            or not (py.get("gauss_next") is None or isinstance(py.get("gauss_next"), float)):
        raise ValueError("its python state is malformed")
    cpu, cuda = state.get("torch"), state.get("cuda")
    if not _bytes_tensor(cpu) or not (cuda is None or _bytes_tensor(cuda)):
        raise ValueError("its torch state is malformed")
    python: tuple[Any, ...] = (py["version"], tuple(py["state"]), py["gauss_next"])
    np_state: tuple[Any, ...] | None = None
    if "numpy" in state:
        n = state["numpy"]
        if not isinstance(n, dict) or not isinstance(n.get("keys"), torch.Tensor) or n["keys"].dim() != 1 \
                or not all(isinstance(n.get(k), int) for k in ("pos", "has_gauss")) \
                or not isinstance(n.get("cached_gaussian"), float):
            raise ValueError("its numpy state is malformed")
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            np_state = ("MT19937", np.asarray(n["keys"].numpy(), dtype=np.uint32), n["pos"], n["has_gauss"],
                        n["cached_gaussian"])
    return python, cpu, cuda, np_state


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) for x in v)


def _bytes_tensor(v: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1
