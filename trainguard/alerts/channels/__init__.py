"""Channels: each turns a ``Message`` into one HTTP request (``Channel.build``)."""
