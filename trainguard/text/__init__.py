"""Text that crosses into an output format: one escaping function per format."""
