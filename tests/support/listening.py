"""The TCP sockets a set of processes listens on, read from /proc (what `ss -ltnp` shows), so a test
can check that a server opens nothing beyond loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # the TCP state column of /proc/net/tcp*


@dataclass(frozen=True, slots=True)
class Listener:
    pid: int
    command: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback_only(self) -> bool:
        mapped = getattr(self.address, "ipv4_mapped", None)
        return (mapped or self.address).is_loopback


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    # the kernel writes each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening_inodes() -> dict[int, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN:
                    host, port = fields[1].split(":")
                    found[int(fields[9])] = (_address(host), int(port, 16))
    return found


def listeners(pids: set[int]) -> list[Listener]:
    """Every listening TCP socket one of ``pids`` holds."""
    inodes = _listening_inodes()
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inode = int(target[len("socket:[") : -1])
                        if inode in inodes:
                            found.append(Listener(pid, command, *inodes[inode]))
    return found
