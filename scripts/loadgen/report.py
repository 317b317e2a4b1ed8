"""What a run shows when it is over: `report`, the few lines printed per level, and `plot`, the
PNG of latency percentiles and CPU against concurrent calls and the levels over time (needs
matplotlib; without it there is no plot, the JSON is written all the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .stats import fmt


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        print("loadtest: no matplotlib, no plot (.venv/bin/pip install 'matplotlib>=3.8,<4')")
        return False
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    levels = result["levels"]
    figure, (latency_ax, cpu_ax, time_ax) = plt.subplots(1, 3, figsize=(17, 5))
    figure.suptitle(
        f"voice_agent load test: {result['mode']} engines, {result['transport']} callers, "
        f"{result['started_at'][:16]}"
    )

    def points(*path: str) -> tuple[list[int], list[float]]:
        """(calls, value) of every level that has the value at `path` in its summary."""
        xs, ys = [], []
        for level in levels:
            value: Any = level
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                xs.append(level["calls"])
                ys.append(float(value))
        return xs, ys

    for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        xs, ys = points("latency_ms_unanswered_as_timeout", key)
        latency_ax.plot(xs, ys, style, label=f"speech end -> first audio {key}")
    xs, ys = points("barge_in_clear_ms", "p95")
    if ys:
        latency_ax.plot(xs, ys, "x--", label="barge-in -> clear p95")
    xs, ys = points("server_added_ms", "p99")
    if ys:
        latency_ax.plot(xs, ys, "d:", label="server-added p99 (caller side)")
    xs, ys = points("server_added_at_server_ms", "p99")
    if ys:
        latency_ax.plot(xs, ys, "P:", label="server-added p99 (at the server)")
    latency_ax.set_xlabel("concurrent calls")
    latency_ax.set_ylabel("ms (unanswered turns count as the timeout)")
    latency_ax.set_title("latency")
    latency_ax.set_ylim(bottom=0)
    latency_ax.grid(alpha=0.3)
    latency_ax.legend(fontsize=8)

    for key, label, style in (
        ("server_cpu_pct", "server mean", "o-"),
        ("loadgen_cpu_pct", "load generator mean", "s--"),
        ("standin_cpu_pct", "stand-in mean", "^:"),
        ("model_cpu_pct", "Realtime stand-in mean", "v:"),
        ("machine_cpu_pct", "whole machine mean", "kx-"),
    ):
        xs, ys = points("resources", key, "mean")
        if ys:
            cpu_ax.plot(xs, ys, style, label=label)
    xs, ys = points("resources", "server_cpu_pct", "max")
    if ys:
        cpu_ax.plot(xs, ys, "o:", alpha=0.5, label="server max")
    xs, ys = points("resources", "server_cpu_wait_pct", "mean")
    if ys:
        cpu_ax.plot(xs, ys, "v--", alpha=0.7, label="server waiting for a CPU")
    cores = result["machine"]["cpus"] or 1
    cpu_ax.axhline(cores * 100, color="grey", linewidth=0.8, linestyle="--")
    cpu_ax.set_xlabel("concurrent calls")
    cpu_ax.set_ylabel("CPU % (100 = one core)")
    cpu_ax.set_title(f"CPU ({cores} cores)")
    cpu_ax.set_ylim(bottom=0)
    cpu_ax.grid(alpha=0.3)
    cpu_ax.legend(fontsize=8)

    offset = 0.0
    for level in levels:
        samples = level["samples"]
        ts = [offset + s["t"] for s in samples]
        time_ax.plot(ts, [s.get("server_cpu_pct") for s in samples], "-", color="tab:blue")
        time_ax.plot(ts, [s.get("live_calls") for s in samples], "-", color="tab:green")
        lags = [s.get("server_loop_lag_ms") for s in samples]
        time_ax.plot(ts, lags, "-", color="tab:red")
        offset = (ts[-1] if ts else offset) + 2
    time_ax.plot([], [], "-", color="tab:blue", label="server CPU %")
    time_ax.plot([], [], "-", color="tab:green", label="live calls")
    time_ax.plot([], [], "-", color="tab:red", label="server loop lag ms")
    time_ax.set_xlabel("seconds (levels one after the other)")
    time_ax.set_title("over time")
    time_ax.grid(alpha=0.3)
    time_ax.legend(fontsize=8)

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def report(level: dict[str, Any]) -> str:
    lat, server = level["latency_ms"], level["server"]
    res = level["resources"]
    lines = [
        f"== {level['calls']} calls: {level['calls_started']} started, outcomes "
        + ", ".join(f"{k} {v}" for k, v in level["outcomes"].items() if v),
        f"  turns {level['turn_count']} (unanswered in {level['reply_timeout_s']:.0f} s: "
        f"{level['unanswered_turns']}); caller speech "
        f"end -> first audio p50 {fmt(lat['p50'])} p95 {fmt(lat['p95'])} "
        f"p99 {fmt(lat['p99'])} max {fmt(lat['max'])} ms",
        f"  server: speech end -> first audio sent p50 "
        f"{fmt(server['speech_end_to_first_audio_ms']['p50'])} p95 "
        f"{fmt(server['speech_end_to_first_audio_ms']['p95'])} ms; stages p50/p95 "
        + ", ".join(
            f"{name} {fmt(values['p50'])}/{fmt(values['p95'])}"
            for name, values in server["stages_ms"].items()
        ),
    ]
    if level["server_added_ms"]["n"]:
        added = level["server_added_ms"]
        line = (
            f"  server-added (beyond end-of-turn silence and engine delays) p50 "
            f"{fmt(added['p50'])} p95 {fmt(added['p95'])} p99 {fmt(added['p99'])} ms"
        )
        at_server = level.get("server_added_at_server_ms") or {}
        if at_server.get("n"):
            line += (
                f"; at the server (turn end -> first audio sent) p50 {fmt(at_server['p50'])} "
                f"p95 {fmt(at_server['p95'])} p99 {fmt(at_server['p99'])} ms"
            )
        lines.append(line)
    barge = level["barge_in_clear_ms"]
    lines.append(
        f"  barge-ins {level['barge_ins']['done']}: speech start -> clear p50 "
        f"{fmt(barge['p50'])} p95 {fmt(barge['p95'])} ms (agent resumed over the caller "
        f"{level['barge_ins']['agent_talked_over_caller']}); backchannels "
        f"{level['backchannels']['said']} (cleared {level['backchannels']['cleared']}, resumed "
        f"{level['backchannels']['resumed']}); reprompts {level['long_silences']['reprompts']}"
    )
    audio = level["audio"]
    lines.append(
        f"  late frames {audio['late_frames']} of {audio['frames']} "
        f"(worst gap {fmt(audio['late_gap_ms']['max'], ' ms')}); server errors "
        f"{server['errors']}"
    )
    lines.append(
        f"  server CPU mean {fmt(res['server_cpu_pct']['mean'])}% max "
        f"{fmt(res['server_cpu_pct']['max'])}% (waiting for a CPU "
        f"{fmt(res['server_cpu_wait_pct']['mean'])}%), RSS max "
        f"{fmt(res['server_rss_mb']['max'])} MB, fds max {fmt(res['server_fds']['max'])}, "
        f"loop lag mean {fmt(res['server_loop_lag_ms']['mean'])} max "
        f"{fmt(res['server_loop_lag_ms']['max'])} ms (worst single sample "
        f"{fmt((res.get('server_loop_lag_max_ms') or {}).get('max'))} ms)"
    )
    sending = level["loadgen_send_lateness_ms"]
    lines.append(
        f"  load generator CPU {fmt(res['loadgen_cpu_pct']['mean'])}% (waiting "
        f"{fmt(res['loadgen_cpu_wait_pct']['mean'])}%), loop lag max "
        f"{fmt(res['loadgen_loop_lag_ms']['max'])} ms, frames sent late p99 "
        f"{fmt(sending['p99_mean'])} max {fmt(sending['max'])} ms | stand-in "
        f"{fmt(res['standin_cpu_pct']['mean'])}%"
        + (
            f" | Realtime stand-in {fmt(res['model_cpu_pct']['mean'])}%"
            if (res.get("model_cpu_pct") or {}).get("n")
            else ""
        )
        + f" | whole machine {fmt(res['machine_cpu_pct']['mean'])}%"
    )
    return "\n".join(lines)
