"""Fault injectors: small classes behind one Protocol (``base.Injector``), each acting for real
on processes, cgroups, links, file systems, checkpoints or the broker."""

from trainguard.drills.injectors.base import Acted, InjectionError, Injector

__all__ = ["Acted", "InjectionError", "Injector"]
