"""The reference workload: a real PyTorch DDP job (gloo on CPU, NCCL with CUDA) with the step
hook and the checkpoint manager. ``python -m trainguard.workload.ddp --help``; users start from
``examples/ddp_job.py``. Needs the ``workload`` extra (torch)."""
