"""The streams worker's consumer limits, apart from the app so the CLI can show them without
importing faust.

Head-of-line: one Kafka consumer feeds both of the worker's agents (the log, in order, and
the urgent copies). While the evaluate agent's buffer is full, the consumer's loop waits, with
any urgent copy it fetched behind the records it is placing. Smaller fetches and a smaller
buffer bound that wait, and cost throughput. Measured on the 2-core box, one 30 s run each
(``python -m bench.bench_streams 256 30 -- --buffer-records N --fetch-bytes B``), node
records/s of one worker: 4,096 + 8 MiB 2,485; 1,024 + 8 MiB 2,037; 256 + 8 MiB 1,784;
4,096 + 1 MiB 1,465. So the defaults stay the throughput ones (faust's buffer, 8 MiB); a site
that wants the urgent lane's worst case lower under a flood lowers them (docs/rules.md).
"""

from __future__ import annotations

BUFFER_RECORDS = 4096  # records fetched ahead per agent (faust's stream_buffer_maxsize)
FETCH_BYTES = 8 << 20  # most bytes per partition and fetch request
