"""Statistics and number formatting: nearest-rank percentiles, the percentile summary every
latency and gap in the results is reported as, and the short form the progress line and the
report print figures in. No dependencies, so every other module can use it."""

from __future__ import annotations


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, as scripts/bench_latency.py reports them."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float | int | None]:
    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)) if values else None,
        "mean": r(sum(values) / len(values)) if values else None,
    }


def fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"
