"""API keys: who a call comes from (a tenant) and whether it may administer the cluster.

Off when no keys are set: every caller is tenant "" and an admin (a local, loopback-only setup).
Keys come from ``--api-keys FILE`` (lines ``KEY TENANT [admin]``; ``#`` comments) or the
environment variable ``SESSION_ROUTER_API_KEYS`` (``KEY:TENANT[:admin],...``). A call presents
its key as metadata ``authorization: Bearer KEY`` or ``x-api-key: KEY``. With keys on,
SessionService serves every valid key (each tenant sees only its own sessions) and AdminService
only keys marked ``admin``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ADMIN = "admin"


class Unauthenticated(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    admin: bool = False


ANONYMOUS_ADMIN = Caller("", admin=True)  # the caller when keys are off


def _caller(tenant: str, role: str | None, where: str) -> Caller:
    if role not in (None, ADMIN):
        raise ValueError(f"{where}: the third field may only be '{ADMIN}', got {role!r}")
    return Caller(tenant, admin=role == ADMIN)


@dataclass(frozen=True)
class ApiKeys:
    callers: dict[str, Caller] = field(default_factory=dict)  # key -> who it is

    @property
    def enabled(self) -> bool:
        return bool(self.callers)

    @classmethod
    def load(cls, path: str | None = None, env: str | None = None) -> ApiKeys:
        callers: dict[str, Caller] = {}
        if path:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    parts = line.split("#", 1)[0].split()
                    if not parts:
                        continue
                    if len(parts) not in (2, 3):
                        raise ValueError(f"{path}:{n}: expected 'KEY TENANT [admin]'")
                    callers[parts[0]] = _caller(parts[1], (parts[2:] or [None])[0], f"{path}:{n}")
        env = os.environ.get("SESSION_ROUTER_API_KEYS", "") if env is None else env
        for item in filter(None, (p.strip() for p in env.split(","))):
            parts = item.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]):
                raise ValueError(
                    "SESSION_ROUTER_API_KEYS must look like KEY:TENANT[:admin],KEY:TENANT[:admin]"
                )
            callers[parts[0]] = _caller(
                parts[1], (parts[2:] or [None])[0], "SESSION_ROUTER_API_KEYS"
            )
        return cls(callers)

    def caller_of(self, metadata: tuple | None) -> Caller:
        """Who calls; raises ``Unauthenticated`` when keys are on and none matches."""
        if not self.enabled:
            return ANONYMOUS_ADMIN
        key = None
        for name, value in metadata or ():
            if name == "authorization" and value.lower().startswith("bearer "):
                key = value[7:].strip()
            elif name == "x-api-key":
                key = value.strip()
        if key is None:
            raise Unauthenticated(
                "missing credentials: send metadata 'authorization: Bearer <api key>'"
            )
        caller = self.callers.get(key)
        if caller is None:
            raise Unauthenticated("unknown API key: check the key you were given")
        return caller
