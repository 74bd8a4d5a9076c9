"""The reference PyTorch DDP job, as a user runs it: one process per rank.

    python examples/ddp_job.py --job-id J --rank R --world-size W --master-addr 127.0.0.1 \\
        --master-port P --ckpt-dir D --steps N --ckpt-every K --keep K --seed S

Everything (flags, exit codes, environment) is ``trainguard.workload.ddp``; see
examples/README.md. This file is the entry point to copy into your own training script: the
step hook (``StepReporter``) and the checkpoint manager (``CheckpointManager``) are the two
pieces to take.
"""

from trainguard.workload.ddp import run_and_exit

if __name__ == "__main__":
    run_and_exit()
