"""The soft-limit webhook: a JSON POST per budget and window, sent from its own thread with a
few bounded retries, so neither the event loop nor the ledger's sync thread waits on a receiver."""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.error
import urllib.request

import orjson

from budgets.decision import Standing

log = logging.getLogger("modelyard.budgets")

ATTEMPTS = 3
_STOP = object()


def payload(s: Standing, now: float) -> bytes:
    """What the receiver gets: who, how much of what, and when the window resets."""
    return orjson.dumps({
        "event": "budget.soft_limit", "scope": s.scope, "id": s.id, "tenant": s.tenant,
        "spend": round(s.spent, 9), "budget": s.budget.usd, "soft_share": s.budget.soft_share,
        "used_ratio": round(s.used_ratio, 6), "period": s.budget.period, "period_start": s.window.iso_start(),
        "reset": s.window.iso_end(), "reset_in_s": s.retry_after_s(now), "sent_at": now})


class WebhookSender:
    def __init__(self, url: str, *, timeout_s: float = 5.0, backoff_s: float = 0.5, limit: int = 1000):
        self.url = url
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._queue: queue.Queue[bytes | object] = queue.Queue(maxsize=limit)
        self._thread = threading.Thread(target=self._run, name="budget-webhook", daemon=True)
        self._thread.start()

    def send(self, body: bytes) -> None:
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.error("budget webhook: %d posts queued; dropping one", self._queue.maxsize)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if body is _STOP:
                return
            assert isinstance(body, bytes)
            self._post(body)

    def _post(self, body: bytes) -> bool:
        for attempt in range(ATTEMPTS):
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 (operator's URL)
                    if 200 <= r.status < 300:
                        return True
                    log.warning("budget webhook answered %d", r.status)
            except urllib.error.HTTPError as e:
                log.warning("budget webhook answered %d", e.code)
            except (OSError, ValueError) as e:
                log.warning("budget webhook failed: %s", type(e).__name__)
            if attempt + 1 < ATTEMPTS:
                time.sleep(self.backoff_s * 2 ** attempt)
        log.error("budget webhook: gave up after %d attempts", ATTEMPTS)
        return False

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (each bounded by its retries), then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
