"""A plain torchrun DDP script with trainguard added: the lines marked ``# trainguard``.

    torchrun --nproc-per-node 2 --rdzv-id my-job examples/torchrun_train.py CKPT_DIR STEPS

The ranks take their identity from torchrun (``identity_from_env``: RANK, WORLD_SIZE, the job
id from ``--rdzv-id``, the binding epoch from torchrun's restart count), report every step
with this rank's own compute (``StepTimer``: DDP's overlap kept) and heartbeats to the node
agent (``$TRAINGUARD_AGENT_SOCKET``), and checkpoint through the ``CheckpointManager`` (its
events reach the agent too); after a restart they resume from the last valid checkpoint.
CKPT_DIR under /tmp is allowed here (a demo); give a durable directory in real jobs.

It is a complete script, not a wrapper: NCCL on this rank's GPU (``LOCAL_RANK``) when CUDA is
there, gloo on CPU otherwise; each step's batch is addressed by (step, rank), so a resumed
run reads exactly the samples an uninterrupted one would from the checkpoint's data position.
Take the marked lines into your own script; the rest is an ordinary DDP loop.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trainguard_sdk import identity_from_env  # trainguard
from trainguard_sdk.checkpoint.collective import TorchCollective  # trainguard
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager  # trainguard
from trainguard_sdk.ddp import StepTimer  # trainguard


def main() -> int:
    ckpt_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    ident = identity_from_env()  # trainguard
    tg = ident.reporter()  # trainguard: step reports + heartbeats to the node agent
    config = CheckpointConfig(ckpt_dir, every_steps=5, allow_tmp=True)  # trainguard
    ckpt = CheckpointManager(config, job_id=ident.job_id,  # trainguard
                             collective=TorchCollective(), sink=tg)  # trainguard
    restored = ckpt.resume(model, optimizer)  # trainguard
    start = restored.progress.step if restored else 0  # trainguard

    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    timer = StepTimer(ddp)  # trainguard
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator()
    for step in range(start + 1, steps + 1):
        g.manual_seed(step * world + rank)  # this step's shard: the data position is the step
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        timer.start()  # trainguard
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        t = timer.stop()  # trainguard
        if t is not None:  # trainguard
            samples = step * 32 * ident.world_size  # trainguard
            # the loss only off the GPU: .item() on CUDA would synchronise every step
            tg.step(step, samples, t.compute_ms, comm_ms=t.comm_ms,  # trainguard
                    step_ms=t.step_ms, loss=None if cuda else loss.item())  # trainguard
        if ckpt.due(step):  # trainguard
            ckpt.save(step, step * 32 * ident.world_size, ddp, optimizer)  # trainguard
    tg.close()  # trainguard
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
