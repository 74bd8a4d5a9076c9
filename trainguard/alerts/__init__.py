"""Alerts to chat: incident transitions in, one opening and one closing message per incident out.

Pure parts: ``model`` (what a notice is), ``coalesce`` (storms into a handful of notices),
``render`` (text), ``signing``, ``ratelimit``, ``backoff``, ``reply`` (how a vendor's answer is
judged), ``secrets`` (redaction). Channels (``channels/``) turn a message into one HTTP request.
I/O at the edges: ``http`` (the poster), ``delivery`` (one worker per channel), ``service``
(the Kafka consumer). See docs/alerts.md.
"""
