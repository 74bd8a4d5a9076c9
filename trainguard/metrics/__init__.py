"""The pipeline-metrics service: the event log, read as a consumer group, on /metrics."""
