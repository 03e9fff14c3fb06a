"""The TCP sockets a group of processes listens on, read from /proc (no tool to install): for
each process its socket inodes (``/proc/PID/fd``), matched with the LISTEN entries of
``/proc/net/tcp`` and ``tcp6``."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    process: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.host)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        return f"{self.process}[{self.pid}] on {self.host}:{self.port}"


def _address(hex_address: str) -> tuple[str, int]:
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    # /proc prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port_hex, 16)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                inodes[fields[9]] = _address(fields[1])
    return inodes


def listeners(pids: list[int]) -> list[Listener]:
    """What ``pids`` listen on (processes that ended meanwhile are skipped)."""
    inodes = _listening_inodes()
    found = []
    for pid in pids:
        try:
            process = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in inodes:
                found.append(Listener(pid, process, *inodes[inode]))
    return found
