"""Callbacks for the frameworks people train with; each module imports its framework, this
package imports nothing (the SDK stays standard-library only):

- ``trainguard_sdk.integrations.lightning``: ``TrainguardCallback`` for PyTorch Lightning
  (package ``lightning``);
- ``trainguard_sdk.integrations.hf``: ``TrainguardCallback`` for Hugging Face
  ``transformers.Trainer``.

Both report every optimizer step, keep the reporter's heartbeat thread running and report
each checkpoint the framework writes; the framework-free step bookkeeping is ``core``.
"""
