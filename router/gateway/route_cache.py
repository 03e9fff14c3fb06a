"""``RouteCache``: where each session lives, so a turn costs no router call.

Routes are cached when a session is opened through this gateway or looked up once. The cache is
bounded (least recently used first out): sessions released behind the gateway's back (idle
timeouts) fall out in time, and a miss costs one router call. A cached route is used only for
the tenant that owns it; another tenant's lookup goes to the router, which decides.
"""

from __future__ import annotations

from cachetools import LRUCache

from replica.api import ActorError
from router.control.api import Route
from router.control.client import RouterClient

ROUTE_CACHE_SIZE = 100_000


class RouteCache:
    def __init__(self, router: RouterClient, size: int = ROUTE_CACHE_SIZE) -> None:
        self.router = router
        self._routes: LRUCache[str, Route] = LRUCache(size)

    async def lookup(self, session_id: str, tenant: str) -> Route | ActorError:
        route = self._routes.get(session_id)
        if route is None or route.tenant != tenant:
            route = await self.router.route(session_id=session_id, tenant=tenant)
            if isinstance(route, Route):
                self._routes[session_id] = route
        return route

    def put(self, route: Route) -> None:
        self._routes[route.session_id] = route

    def drop(self, session_id: str) -> None:
        self._routes.pop(session_id, None)

    def drop_replica(self, replica_id: str) -> None:
        """Forget every route to a replica that died."""
        for sid in [sid for sid, r in self._routes.items() if r.replica_id == replica_id]:
            del self._routes[sid]
