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
from trainguard_sdk.integrations.core import StepLoop  # trainguard


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
    # trainguard: each step reported under its own number (on CUDA the timer's figures come a
    # step late), with the section of the step the rank is in for the heartbeats
    loop = StepLoop(tg, ident.world_size, samples=start * 32 * ident.world_size)  # trainguard
    loop.timer = StepTimer(ddp, reporter=tg)  # trainguard: own compute, DDP's overlap kept
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator()
    for step in range(start + 1, steps + 1):
        g.manual_seed(step * world + rank)  # this step's shard: the data position is the step
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loop.begin()  # trainguard: the step starts (forward)
        loop.add_batch(32)  # trainguard
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loop.backward()  # trainguard
        loss.backward()
        loop.optimizer()  # trainguard
        optimizer.step()
        # the loss only off the GPU: .item() on CUDA would synchronise every step
        loop.end(step, loss=None if cuda else loss.item())  # trainguard: report, then data
        if ckpt.due(step):  # trainguard
            loop.checkpoint()  # trainguard
            ckpt.save(step, loop.samples, ddp, optimizer)  # trainguard
            loop.data()  # trainguard
    loop.flush()  # trainguard: the last step's figures (on CUDA they wait for the device)
    tg.leaving(0, "completed")  # trainguard: this exit is the end, no fault
    tg.close()  # trainguard
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
