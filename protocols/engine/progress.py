"""One line per stage a person can follow through a long run:

    [7/18] seed0/anchor@anchor_coef=1000 — ran 24 s; 3:12 elapsed, ~5 min left

The remaining time is the mean wall time of the stages run so far times the stages still expected to run (those
without a finished result, and those `--force` reruns); reused stages cost nothing. Printed by global rank 0 only.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional

from protocols.engine.spec import Hooks, StageSpec
from protocols.engine.run_files import is_global_zero


class Progress:
    def __init__(self, specs: list[StageSpec], hooks: Hooks, quiet: bool = False, forced: int = 0):
        self.total = len(specs)
        self.count = 0
        self.start = time.time()
        self.seconds: list[float] = []
        self.to_run = sum(1 for s in specs if hooks.finished(s) is None) + forced if not quiet else 0
        self.quiet = quiet or not is_global_zero()
        self._lock = threading.Lock()

    def ran(self, spec: StageSpec, result: Optional[dict], seconds: float) -> None:
        with self._lock:
            self.seconds.append(seconds)
            self.to_run = max(0, self.to_run - 1)
            status = (result or {}).get("status", "done")
            what = "ran" if status == "done" else status
            error = f" ({str((result or {}).get('error', ''))[:120]})" if status not in ("done",) else ""
            self._line(spec, f"{what} {seconds:.0f} s{error}" if seconds < 60 else f"{what} {_clock(seconds)}{error}")

    def settled(self, spec: StageSpec, action: str, result: Optional[dict]) -> None:
        """A stage that did not run: reused, or blocked by its upstream (the protocol's stand-in result)."""
        with self._lock:
            if action == "blocked":
                self._line(spec, f"{(result or {}).get('status', 'blocked')} ({(result or {}).get('error', '')})")
            else:
                self._line(spec, "reused")

    def _line(self, spec: StageSpec, what: str) -> None:
        self.count += 1
        if self.quiet:
            return
        elapsed = time.time() - self.start
        print(f"[{self.count}/{self.total}] {spec.key} — {what}; {_clock(elapsed)} elapsed{self._left()}",
              file=sys.stdout, flush=True)

    def _left(self) -> str:
        if not self.to_run:
            return ""
        if not self.seconds:
            return f", {self.to_run} stage(s) to run"
        left = sum(self.seconds) / len(self.seconds) * self.to_run
        return f", ~{_duration(left)} left ({self.to_run} stage(s) to run)"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else \
        f"{seconds / 3600:.1f} h"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
