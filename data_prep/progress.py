"""A tqdm progress bar showing MB/s and ETA (from input bytes) plus documents/s and tokens/s."""

from __future__ import annotations

import sys
import time


class Progress:
    """Progress over a byte total; `update` adds bytes, documents and tokens."""

    def __init__(self, total_bytes: int, enabled: bool = True, desc: str = "") -> None:
        self.t0 = time.time()
        self.docs = self.tokens = 0
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=max(1, total_bytes), unit="B", unit_scale=True, unit_divisor=1000, desc=desc,
                             file=sys.stderr, dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 10)

    def update(self, nbytes: int, docs: int, tokens: int) -> None:
        """Account for finished work."""
        self.docs += docs
        self.tokens += tokens
        if self._bar is not None:
            dt = max(time.time() - self.t0, 1e-9)
            self._bar.set_postfix_str(f"{self.docs / dt:,.0f} docs/s, {self.tokens / dt:,.0f} tok/s", refresh=False)
            self._bar.update(nbytes)

    def write(self, msg: str) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.close()
