"""Waiting on a fake peer's state without sleeping: a test names what it waits for and a
predicate; the peer re-checks every predicate whenever something happens (a message from the
server, a playout tick) and fails the wait, saying what was awaited, once its socket closes
or its timeout passes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Waiter = tuple[Callable[[], bool], "asyncio.Future[None]", str]


class PredicateWaits:
    """Mixed into a fake carrier: it sets `closed`, `timeout` and `_waiters = []`, has a
    `summary`, and calls `_notify()` after each thing that happens."""

    closed: bool
    timeout: float
    _waiters: list[Waiter]

    @property
    def summary(self) -> str:
        raise NotImplementedError

    def _notify(self) -> None:
        for predicate, future, what in self._waiters:
            if future.done():
                continue
            if predicate():
                future.set_result(None)
            elif self.closed:
                future.set_exception(AssertionError(f"closed waiting for {what}; {self.summary}"))

    async def wait_until(self, what: str, predicate: Callable[[], bool]) -> None:
        """Re-checked on every message from the server and every playout tick."""
        if predicate():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (predicate, future, what)
        self._waiters.append(entry)
        self._notify()
        try:
            await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; {self.summary}") from None
        finally:
            self._waiters.remove(entry)
