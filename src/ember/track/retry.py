"""When the upload client sends a request again: exponential backoff with jitter, within a deadline.

Every request of the upload protocol is idempotent (metadata is put whole, lines go with their
byte range and the server's cursor, blobs by digest), so any request may be sent again. The
client does so on the answers that mean "not now": a dropped or refused connection, a timeout,
429 (too many requests), 502/503/504 (a server or its proxy unavailable), and the server's own
409 that carries ``Retry-After`` (a concurrent request changed the same rows; see
``ember.server.api.errors``). Any other answer is final at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers sent again whatever they say; a 409 only with ``Retry-After``."""


@dataclass(frozen=True)
class Retry:
    """How long and how often one request is tried.

    Attempt ``n`` (0 for the first retry) waits a random time between 0 and
    ``min(max_backoff_s, base_s * 2**n)`` ("full jitter": clients cut off together do not come
    back together), or the server's ``Retry-After`` when that is longer. The request gives up
    when the next attempt would start after ``deadline_s`` from its first.

    Attributes:
        deadline_s: the most time one request may take, every attempt and wait included.
        base_s: the ceiling of the first wait; it doubles with each attempt.
        max_backoff_s: the largest ceiling of one wait.

    Example:
        >>> Client(retry=Retry(deadline_s=600))   # ride out a server restart of up to ten minutes
    """

    deadline_s: float = 120.0
    base_s: float = 0.5
    max_backoff_s: float = 30.0

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (0 first), drawn with full jitter."""
        ceiling = min(self.max_backoff_s, self.base_s * 2 ** min(retry, 60))
        return (rng or random).uniform(0.0, ceiling)


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an HTTP answer asks for the request again (see the module)."""
    return status in RETRY_STATUSES or (status == 409 and "retry-after" in {k.lower() for k in headers})


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (a number or an HTTP date), or None."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None  # unreadable: the backoff alone decides
