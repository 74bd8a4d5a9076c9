"""RNG states as JSON-able values: Python's ``random``, NumPy's global generator (only when
NumPy is already imported: a trainer that does not use it does not pay for it), torch's CPU
generator and, when CUDA is initialised, every CUDA device's. Restoring them makes the steps
after a resume draw the same numbers (dropout masks, shuffles, noise) as an uninterrupted
run. torch is imported only when the trainer already did."""

from __future__ import annotations

import base64
import random
import sys
from typing import Any

RngState = dict[str, Any]


def capture() -> RngState:
    version, internal, gauss = random.getstate()
    state: RngState = {"python": [version, list(internal), gauss]}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss),
                          float(cached)]
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = _b64(bytes(torch.get_rng_state().tolist()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [_b64(bytes(s.tolist())) for s in torch.cuda.get_rng_state_all()]
    return state


def restore(state: RngState) -> list[str]:
    """Set every generator the state holds; the names restored. ValueError naming the field
    when a value has the wrong shape."""
    done: list[str] = []
    py = state.get("python")
    if py is not None:
        try:
            version, internal, gauss = py
            random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"rng.python: {exc}") from None
        done.append("python")
    np_state = state.get("numpy")
    if np_state is not None:
        import numpy as np  # present when the trainer that saved it used it

        name, keys, pos, has_gauss, cached = np_state
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        done.append("numpy")
    if "torch" in state or "cuda" in state:
        import torch

        if "torch" in state:
            torch.set_rng_state(torch.tensor(list(_unb64(state["torch"], "torch")),
                                             dtype=torch.uint8))
            done.append("torch")
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(list(_unb64(s, "cuda")),
                                                       dtype=torch.uint8)
                                          for s in state["cuda"]])
            done.append("cuda")
    return done


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"rng.{name}: base64 text expected")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise ValueError(f"rng.{name}: {exc}") from None
