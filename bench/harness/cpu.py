"""CPU seconds (user + system) spent by this run's processes, read from /proc (Linux; elsewhere
every group reads 0). Processes are this one, its descendants (an embedded Ray instance and its
workers, client processes) and nothing else, grouped by role:

- ``named``: pids given by the benchmark (``{client.pid: "client"}``); this process is "gateway"
  (the gateway's event loop and the benchmark's own drivers run here);
- Ray actors by the command line Ray gives their workers (``ray::ReplicaActor`` -> "replica",
  ``ray::SessionRouter`` -> "router");
- everything else, "ray" (raylet, GCS, agents, idle workers).

Take a ``sample()`` before and after a measurement; ``delta`` is the CPU it cost per group.
"""

from __future__ import annotations

import os

ACTOR_GROUPS = {b"ray::ReplicaActor": "replica", b"ray::SessionRouter": "router"}
OTHERS = "ray"
THIS_PROCESS = "gateway"


class CpuMeter:
    def __init__(self, named: dict[int, str], actors: dict[bytes, str] = ACTOR_GROUPS) -> None:
        self.named = {os.getpid(): THIS_PROCESS, **named}
        self.actors = actors
        self.groups = tuple(dict.fromkeys([*self.named.values(), *actors.values(), OTHERS]))
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _processes(self) -> dict[int, tuple[int, float]]:
        """Every process: pid -> (parent pid, CPU seconds so far)."""
        out = {}
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / self._tick)
        return out

    def _group(self, pid: int) -> str | None:
        if pid in self.named:
            return self.named[pid]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read(64)
        except OSError:
            return None
        return next((g for prefix, g in self.actors.items() if command.startswith(prefix)), OTHERS)

    def sample(self) -> dict[str, float]:
        """CPU seconds so far per group, over this process and its descendants."""
        processes = self._processes()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in processes.items():
            children.setdefault(parent, []).append(pid)
        out = dict.fromkeys(self.groups, 0.0)
        stack = [os.getpid()]
        while stack:
            pid = stack.pop()
            stack.extend(children.get(pid, ()))
            group = self._group(pid) if pid in processes else None
            if group is not None:
                out[group] += processes[pid][1]
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {group: after[group] - before[group] for group in before}
