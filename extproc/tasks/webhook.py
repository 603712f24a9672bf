"""Completion webhooks: the task's public view, POSTed with an HMAC-SHA256 signature over the body.

The receiver recomputes `sha256=<hex>` over the raw body with its tenant's secret and compares
in constant time (docs/tasks.md shows how); the secret itself never travels.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging

import aiohttp

log = logging.getLogger("modelyard.tasks")

SIGNATURE_HEADER = "x-modelyard-signature"
_ATTEMPTS = 3


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """What a receiver does (tests use it too)."""
    return header is not None and hmac.compare_digest(header.encode(), signature(secret, body).encode())


async def deliver(session: aiohttp.ClientSession, url: str, task_id: str, body: bytes, secret: bytes,
                  timeout_s: float = 10.0) -> bool:
    """POST until a 2xx, three tries with a growing pause; False when the receiver never took it."""
    headers = {"content-type": "application/json", SIGNATURE_HEADER: signature(secret, body),
               "x-modelyard-task-id": task_id}
    for attempt in range(_ATTEMPTS):
        try:
            async with session.post(url, data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if 200 <= r.status < 300:
                    return True
                log.info("task %s: webhook answered %d", task_id, r.status)
        except (TimeoutError, aiohttp.ClientError) as e:
            log.info("task %s: webhook failed: %s", task_id, type(e).__name__)
        await asyncio.sleep(0.5 * 2 ** attempt)
    return False
