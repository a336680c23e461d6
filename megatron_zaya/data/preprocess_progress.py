"""The progress of tools/preprocess_data.py: a tqdm bar on a terminal, else log lines (preprocess.run)."""
from __future__ import annotations

import sys
import time

from megatron_zaya.units import format_duration, human_bytes

LOG_SECONDS = 60       # without a terminal, a log line at least this often (long documents: few per interval)


class Progress:
    """A tqdm bar (bytes of the input on disk, with docs/s and tokens/s) or log lines, every `log_interval`
    documents and at least every LOG_SECONDS."""

    def __init__(self, total_bytes: int | None, enabled: bool | None, log_interval: int):
        self.start = self.last_line = time.time()
        self.total_bytes, self.read_bytes = total_bytes, 0      # of the input on disk
        self.log_interval = max(1, log_interval)
        self.next_log = self.log_interval
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr,
                            mininterval=0.5)

    def update(self, stats, read_bytes: int) -> None:
        """`stats` so far (preprocess.Stats), with the input read on disk up to `read_bytes` (a ReadPosition's)."""
        now = time.time()
        dt = max(now - self.start, 1e-9)
        self.read_bytes = read_bytes
        if self.bar is not None:
            self.bar.update(read_bytes - self.bar.n)
            self.bar.set_postfix_str(f"{stats.documents / dt:,.0f} docs/s, {stats.tokens / dt / 1e6:.2f}M tok/s", refresh=False)
        elif stats.documents >= self.next_log or now - self.last_line >= LOG_SECONDS:
            self.last_line = now
            print(f"processed {stats.documents:,} documents ({stats.documents / dt:,.0f} docs/s, "
                  f"{stats.tokens / dt / 1e6:.2f}M tokens/s, {stats.bytes / dt / 1e6:.1f} MB/s){self.share(dt)}",
                  file=sys.stderr, flush=True)
            while self.next_log <= stats.documents:
                self.next_log += self.log_interval

    def share(self, elapsed: float) -> str:
        """', 42% of 1.20 GiB, ETA 3m10s' of the input on disk read in `elapsed` seconds (nothing when its size is
        unknown)."""
        if not self.total_bytes:
            return ""
        done = min(1.0, self.read_bytes / self.total_bytes)
        left = elapsed * (1 - done) / max(done, 1e-9)
        return f", {100 * done:.0f}% of {human_bytes(self.total_bytes)}, ETA {format_duration(left)}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
