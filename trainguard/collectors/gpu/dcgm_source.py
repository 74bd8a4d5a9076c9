"""The dcgm-exporter scrape source: GET ``/metrics``, parse, map to ``GpuSample``.

Never raises into the agent: a failed fetch counts ``dcgm_fetch`` (or ``dcgm_http_<code>``)
and returns an empty reading; bad text is counted by ``parse_dcgm_text``.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request

from trainguard.collectors.base import Reading
from trainguard.collectors.gpu.dcgm_parse import parse_dcgm_text, to_gpu_samples
from trainguard.collectors.gpu.sample import MalformedLog

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"
MAX_BYTES = 16 * 1024 * 1024


def fetch_metrics(url: str, timeout_s: float) -> str:
    """The body of ``url`` as text; raises ``OSError`` / ``urllib.error.URLError`` / ValueError."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body: bytes = resp.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError(f"scrape larger than {MAX_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


class DcgmExporterCollector:
    """Scrapes a dcgm-exporter. ``url``: its metrics URL; ``timeout_s``: per scrape."""

    name = "dcgm"

    def __init__(self, url: str = DEFAULT_URL, *, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._bad = MalformedLog(log, f"dcgm-exporter {url}")

    def collect(self, now_us: int) -> Reading:
        reading = Reading()
        try:
            text = fetch_metrics(self.url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            self._bad.count(reading.malformed, f"dcgm_http_{exc.code}", str(exc))
            return reading
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._bad.count(reading.malformed, "dcgm_fetch", repr(exc))
            return reading
        return self.parse(text, reading)

    def parse(self, text: str, reading: Reading | None = None) -> Reading:
        """Map one scrape's text into ``reading`` (exposed for replays and tests)."""
        reading = reading if reading is not None else Reading()
        scrape = parse_dcgm_text(text)
        reading.gpus.extend(to_gpu_samples(scrape))
        for kind, n in scrape.malformed.items():
            self._bad.count(reading.malformed, kind, scrape.first_bad.get(kind, ""), n)
        return reading
