"""Server-process log setup (API, relay, workers): every line carries the correlation id;
bodies and secrets are never logged."""

from __future__ import annotations

import logging

from store.correlation import current_correlation_id


class CorrelationIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.correlation_id = current_correlation_id() or "-"
        return True


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(CorrelationIdFilter())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [correlation_id=%(correlation_id)s] %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own access log has no correlation id; ours replaces it.
    logging.getLogger("uvicorn.access").disabled = True
