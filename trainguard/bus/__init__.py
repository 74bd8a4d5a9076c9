"""Kafka I/O at the edge: configuration, topics, producing and validated consuming."""
