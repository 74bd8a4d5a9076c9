"""trainguard's trainer side: ``StepReporter`` sends step reports, heartbeats and checkpoint
records to the node agent over a Unix datagram socket (format: ``trainguard_sdk.wire``; socket
path: ``trainguard_sdk.paths``); ``identity_from_env`` takes the rank's identity from its
launcher (torchrun, Slurm, trainguard's actuator). Standard library only: light to import,
no torch until a torch-specific module (``ddp``, ``checkpoint.manager``) is imported."""

from trainguard_sdk.identity import Identity, IdentityError, Layout, identity_from_env
from trainguard_sdk.paths import DEFAULT_SOCKET, ENV_SOCKET, default_socket_path
from trainguard_sdk.reporter import StepReporter
from trainguard_sdk.wire import Section

__all__ = ["DEFAULT_SOCKET", "ENV_SOCKET", "Identity", "IdentityError", "Layout", "Section",
           "StepReporter", "default_socket_path", "identity_from_env"]
