"""Offline import: a kernel log, a fault log or a step trace -> events a replay takes."""
