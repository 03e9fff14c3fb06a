"""API keys: which tenant a call comes from. Off (every caller is tenant "") when no keys are set.

Keys come from ``--api-keys FILE`` (lines ``KEY TENANT``; ``#`` comments) or the environment
variable ``SESSION_ROUTER_API_KEYS`` (``KEY:TENANT,KEY:TENANT``). A call presents its key as
metadata ``authorization: Bearer KEY`` or ``x-api-key: KEY``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class Unauthenticated(Exception):
    pass


@dataclass(frozen=True)
class ApiKeys:
    tenants: dict[str, str] = field(default_factory=dict)  # key -> tenant

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    @classmethod
    def load(cls, path: str | None = None, env: str | None = None) -> ApiKeys:
        tenants: dict[str, str] = {}
        if path:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    line = line.split("#", 1)[0].strip()
                    if not line:
                        continue
                    parts = line.split()
                    if len(parts) != 2:
                        raise ValueError(f"{path}:{n}: expected 'KEY TENANT'")
                    tenants[parts[0]] = parts[1]
        env = os.environ.get("SESSION_ROUTER_API_KEYS", "") if env is None else env
        for item in filter(None, (p.strip() for p in env.split(","))):
            key, sep, tenant = item.partition(":")
            if not sep or not key or not tenant:
                raise ValueError("SESSION_ROUTER_API_KEYS must look like KEY:TENANT,KEY:TENANT")
            tenants[key] = tenant
        return cls(tenants)

    def tenant_of(self, metadata: tuple | None) -> str:
        """The caller's tenant; raises ``Unauthenticated`` when keys are on and none match."""
        if not self.enabled:
            return ""
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
        tenant = self.tenants.get(key)
        if tenant is None:
            raise Unauthenticated("unknown API key: check the key you were given")
        return tenant
