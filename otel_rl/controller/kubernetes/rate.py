"""The controller's limit on how fast it creates Jobs (`jobs_per_second`, `burst`)."""

import asyncio
import time


class RateLimit:
    """A token bucket: at most `burst` at once, then `per_second`."""

    def __init__(self, per_second: float, burst: int) -> None:
        self._per_second = per_second
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._last) * self._per_second)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._per_second)
