"""The node agent: collectors of one node, batched into Kafka, spooled through outages."""
