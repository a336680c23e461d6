"""Byte counts as people read them (the inspection tools, cleanup messages)."""


def human_bytes(n: int | None) -> str:
    """1536 -> "1.50 KiB"; None (unknown) -> "?"."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
