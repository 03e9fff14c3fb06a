"""An optional cProfile of this process during chosen calls. The gateway's event loop runs in
the benchmark's process, so this shows where the gateway's time goes (``--profile-gateway``)."""

from __future__ import annotations

import contextlib
import cProfile
import pstats
from collections.abc import Iterator


class GatewayProfile:
    """Profiles this process inside ``during()`` blocks when ``path`` is given; a no-op else."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._profiler = cProfile.Profile() if path else None

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        if self._profiler is None:
            yield
            return
        self._profiler.enable()
        try:
            yield
        finally:
            self._profiler.disable()

    def report(self, top: int = 30) -> None:
        """Writes the profile to ``path`` and prints its ``top`` entries by own time."""
        if self._profiler is None:
            return
        self._profiler.dump_stats(self.path)
        print(f"\ncProfile of this process (the gateway) during the gRPC runs: {self.path}")
        pstats.Stats(self._profiler).sort_stats("tottime").print_stats(top)
