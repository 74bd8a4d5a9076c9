"""trainguard: keeps long distributed training jobs running."""

__version__ = "0.1.0"  # the fallback of `trainguard --version` when no distribution is installed
