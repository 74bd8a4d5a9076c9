"""trainguard: keeps long distributed training jobs running."""
