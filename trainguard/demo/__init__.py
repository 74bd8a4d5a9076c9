"""The demo behind README's main command."""
