"""The reference PyTorch DDP job, as a user runs it: one process per rank.

    python examples/ddp_job.py --job-id J --rank R --world-size W --master-addr 127.0.0.1 \\
        --master-port P --ckpt-dir D --steps N --ckpt-every K --keep K --seed S

This file only starts the reference workload the drills and the demo run: everything (flags,
exit codes, environment) is ``trainguard.workload.ddp``; see examples/README.md. It is not the
file to copy: to add trainguard to your own training script, start from
``examples/torchrun_train.py`` (a complete torchrun DDP script, the SDK's lines marked), or
the Lightning and Hugging Face examples beside it.
"""

from trainguard.workload.ddp import run_and_exit

if __name__ == "__main__":
    run_and_exit()
