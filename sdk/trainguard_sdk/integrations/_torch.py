"""The one torch-aware helper of the integrations: install ``StepTimer`` on a DDP model when
possible, else fall back to the wall clock (``core.WallTimer``), saying why once."""

from __future__ import annotations

import logging
from typing import Any

from trainguard_sdk.integrations.core import Timer, WallTimer

log = logging.getLogger("trainguard_sdk")


def timer_for(model: object, *, hook: Any = None, state: Any = None,
              reporter: Any = None) -> tuple[Timer, str]:
    """(timer, how): ``StepTimer`` on ``model`` if it is a ``DistributedDataParallel`` whose
    communication hook is still free ("ddp-hook"), else a ``WallTimer`` ("wall: <why>").
    ``reporter``: the ``StepTimer`` enters ``Section.COMM`` on it at this rank's last bucket."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        why = f"wall: the model is a {type(model).__name__}, not DistributedDataParallel"
    else:
        from trainguard_sdk.ddp import StepTimer

        try:
            return StepTimer(model, hook=hook, state=state, reporter=reporter), "ddp-hook"
        except Exception as exc:  # a hook already registered (the framework's own): keep it
            why = f"wall: the DDP communication hook could not be installed ({exc})"
    log.warning("trainguard: step timing from the wall clock (%s); pass your DDP comm hook "
                "to the trainguard callback (hook=, state=) to keep compute timing", why)
    return WallTimer(), why
