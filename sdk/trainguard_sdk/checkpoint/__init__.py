"""Trainer-side checkpoints: atomic, checksummed, verified before loading, the last K kept.

Torch-free: ``atomic`` (temp file, fsync, rename, fsync dir), ``manifest`` (checksums),
``store`` (layout, verification, keep-K, quarantine), ``location`` (durable-directory check),
``rng`` (RNG states as JSON), ``collective`` (what the manager needs from the process group).
Needs torch: ``manager`` (``CheckpointManager``). Nothing is imported here, so importing
``trainguard_sdk`` or this package never imports torch.
"""
