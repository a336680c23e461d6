"""Byte counts, durations and times as people read them (the inspection tools, cleanup messages, ETAs, log
lines)."""
import time


def human_bytes(n: int | None) -> str:
    """1536 -> "1.50 KiB"; None (unknown) -> "?"."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def format_duration(seconds: float) -> str:
    """12345 -> "3h25m45s", 75 -> "1m15s"; for ETAs."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def timestamp() -> str:
    """'[2026-12-06 23:04:29]': the prefix of a console line."""
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}]"
