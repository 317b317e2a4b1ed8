"""Every worker's metrics from whichever worker a scrape reaches.

With `voice-agent serve --workers N` the workers share one port, so each scrape of /metrics
lands on one of them at random. Answered alone, the counters of different workers would take
turns in one series, and Prometheus would read every turn as a counter reset. Instead, each
worker writes its metrics (the Prometheus text format) to a file in a directory the workers
share, every `WRITE_INTERVAL_S`; a scrape is answered with the worker's own live metrics and
the others' files, every sample labelled with its `worker`. Each series then belongs to one
worker and only ever grows; `sum without (worker)` gives the server's totals.

A file written more than `STALE_AFTER_S` ago (a worker that died without removing it) is left
out, so a dead worker's numbers do not stay frozen in the answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from voice_agent.observability.metrics import ServerMetrics

log = logging.getLogger("voice_agent.metrics")

WRITE_INTERVAL_S = 1.0
STALE_AFTER_S = 10.0
_FILE = re.compile(r"worker-(\d+)\.prom")


class _Merged:
    """A collector of several workers' metrics, one family per name, each sample labelled
    with its worker."""

    def __init__(self, texts: dict[int, str]) -> None:
        merged: dict[str, Metric] = {}
        for worker, text in sorted(texts.items()):
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError as exc:
                # A file that does not parse (a partial copy, another version's) must not
                # cost the scrape the other workers' numbers.
                log.warning("metrics: worker %d's metrics do not parse: %s", worker, exc)
                continue
            label = str(worker)
            for family in families:
                target = merged.get(family.name)
                if target is None:
                    target = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = target
                target.samples.extend(
                    s._replace(labels={**s.labels, "worker": label}) for s in family.samples
                )
        self._families = list(merged.values())

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class SharedMetrics:
    """One worker's side of the shared directory: writes its file, answers for all."""

    def __init__(self, metrics: ServerMetrics, directory: Path, worker: int) -> None:
        self.metrics = metrics
        self.directory = directory
        self.worker = worker
        self.path = directory / f"worker-{worker}.prom"
        self._task: asyncio.Task[None] | None = None

    def write(self) -> None:
        """Write this worker's metrics now (atomically: a reader never sees half a file)."""
        body, _ = self.metrics.render()
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(body)
        partial.replace(self.path)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._keep_writing())

    async def _keep_writing(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.write)
            except OSError as exc:
                # A full or read-only disk loses the other workers' view of this one, not
                # the call; say so once a minute at most.
                log.warning("metrics: cannot write %s: %s", self.path, exc)
                await asyncio.sleep(60)
            await asyncio.sleep(WRITE_INTERVAL_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.path.unlink(missing_ok=True)

    def _others(self) -> Iterable[tuple[int, str]]:
        try:
            paths = list(self.directory.iterdir())
        except FileNotFoundError:
            return
        now = time.time()
        for path in paths:
            match = _FILE.fullmatch(path.name)
            if match is None or int(match[1]) == self.worker:
                continue
            try:
                if now - path.stat().st_mtime > STALE_AFTER_S:
                    continue
                yield int(match[1]), path.read_text(encoding="utf-8")
            except OSError:
                continue  # removed as its worker stopped

    def render(self) -> tuple[bytes, str]:
        """The body and Content-Type of a GET /metrics answer, for every live worker."""
        body, _ = self.metrics.render()
        texts = {self.worker: body.decode()}
        for worker, text in self._others():
            texts[worker] = text
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(texts))
        return generate_latest(registry), CONTENT_TYPE_LATEST
