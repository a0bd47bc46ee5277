"""The replicas behind the gateway, kept current: each is polled for health and load, and its
router's tree events are followed (ZeroMQ SUB) into the gateway's view of its cache, which is
synced from a snapshot whenever it is out of step (at join, after a gap, a restart, an
outage). Replicas come from the command line, the admin endpoint, or a DNS name watched for
its addresses (a Kubernetes headless Service)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import time
from typing import Any

import aiohttp
import numpy as np
import zmq
import zmq.asyncio
from starlette.datastructures import Headers

from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway.connections import ConnectionPool
from radixcluster.gateway.replica import Replica
from radixcluster.gateway.upstream import UPSTREAM_ERRORS, open_session
from radixcluster.protocol import PROTOCOL_VERSION, ProtocolError, TreeEvent, decode
from radixcluster.router.api.auth import presented_key

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 2.0
SNAPSHOT_TIMEOUT_S = 30.0
EVENT_WAIT_MS = 200


class ReplicaSet:
    """Owns the replicas, the tasks that watch them and the HTTP session to them; used inside
    one event loop, between ``start`` and ``close``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._http: aiohttp.ClientSession | None = None
        self.pool = ConnectionPool()  # the forwarded requests' connections
        self.headers = {"Authorization": f"Bearer {config.replica_api_key}"} if config.replica_api_key else {}
        self._replicas: dict[str, Replica] = {}
        self._tasks: dict[str, list[asyncio.Task]] = {}
        self._zmq = zmq.asyncio.Context()
        self._discovery: asyncio.Task | None = None
        self._other_versions: set[str] = set()  # replicas whose blocks are named otherwise (logged once)

    def client_headers(self, headers: Headers) -> dict[str, str]:
        """What a client's generation or cache call (its ``headers``) carries to a replica: the
        client's own key (its Authorization, or its x-api-key as one) when the replicas tell
        tenants or the admin apart, else the gateway's key."""
        authorization = presented_key(headers.raw)
        if self.config.passes_client_keys and authorization:
            return {"Authorization": authorization.decode("latin-1")}
        return self.headers

    def list(self) -> list[Replica]:
        return list(self._replicas.values())

    def get(self, url: str) -> Replica | None:
        return self._replicas.get(url.rstrip("/"))

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("the replica set is not started")
        return self._http

    async def start(self) -> None:
        self._http = open_session()  # in the loop that serves: the session belongs to it
        for url in self.config.replicas:
            self.add(url)
        if self.config.discover:
            self._discovery = asyncio.create_task(self._discover(self.config.discover), name="gateway-discovery")

    async def close(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
        for url in list(self._replicas):
            await self.remove(url)
        self._zmq.term()
        self.pool.close()
        if self._http is not None:
            await self._http.close()

    def add(self, url: str) -> Replica:
        """Start watching a replica (its first poll makes it available)."""
        replica = Replica(url, self.config.health)
        if replica.url in self._replicas:
            return self._replicas[replica.url]
        self._replicas[replica.url] = replica
        self._tasks[replica.url] = [
            asyncio.create_task(self._poll(replica), name=f"poll {replica.url}"),
            asyncio.create_task(self._follow(replica), name=f"events {replica.url}"),
        ]
        logger.info("replica %s added", replica.url)
        return replica

    async def remove(self, url: str) -> bool:
        """Stop sending to a replica and forget it (requests already there finish)."""
        replica = self._replicas.pop(url.rstrip("/"), None)
        if replica is None:
            return False
        tasks = self._tasks.pop(replica.url)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pool.drop(replica.url)
        replica.poll_failed("removed")
        logger.info("replica %s removed", replica.url)
        return True

    async def get_json(self, replica: Replica, path: str, timeout: float = POLL_TIMEOUT_S) -> Any:
        """``GET`` a replica's JSON endpoint; UPSTREAM_ERRORS (ClientResponseError for a non-200),
        ValueError for a body that is not JSON."""
        bound = aiohttp.ClientTimeout(total=timeout)
        async with self.http.get(replica.url + path, headers=self.headers, timeout=bound) as response:
            response.raise_for_status()
            return json.loads(await response.read())

    # ------------------------------------------------------------ health and load

    async def _poll(self, replica: Replica) -> None:
        interval = self.config.health.interval_s
        behind_at: int | None = None  # the view's event number when the replica was last seen ahead of it
        while True:
            if replica.breaker.may_probe(time.monotonic()):
                try:
                    asked = time.monotonic()
                    load = await self.get_json(replica, "/load")
                    if not replica.healthy:
                        await self._join(replica)
                        if replica.last_error is not None:
                            logger.warning("replica %s is back", replica.url)
                    replica.load.polled(load["prefilling_tokens"] + load["waiting_tokens"])
                    replica.poll_passed()
                    behind_at = self._check_events(replica, load, behind_at)
                    replica.view.observed(load.get("tree_events_instance"), load.get("tree_events_seq"), asked)
                except asyncio.TimeoutError:
                    # its router answers between steps, and a step can be long: busy, not gone
                    replica.poll_slow()
                except (*UPSTREAM_ERRORS, ValueError, KeyError) as exc:
                    if replica.healthy:
                        logger.warning("replica %s is down: %s", replica.url, exc)
                    replica.poll_failed(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(interval)

    async def _join(self, replica: Replica) -> None:
        """A replica (re)appeared: learn its page size, cache mode and events address."""
        info = await self.get_json(replica, "/get_server_info")
        view = replica.view
        view.page_size = int(info["page_size"])
        view.enabled = not info.get("disable_radix_cache", False)
        advertised = info.get("kv_events_address")
        replica.events_address = replica.events_endpoint(advertised) if advertised else None
        if advertised is None and view.enabled:
            logger.warning("replica %s publishes no tree events: routing to it by load only", replica.url)

    def _check_events(self, replica: Replica, load: dict[str, Any], behind_at: int | None) -> int | None:
        """A view that stayed behind the router's event count for a whole poll interval lost
        the last events (nothing after them shows the gap): sync it again."""
        view = replica.view
        seq, instance = load.get("tree_events_seq"), load.get("tree_events_instance")
        if not view.synced or seq is None:
            return None
        if instance != view.instance:
            view.clear()
            return None
        if seq <= view.seq:
            return None
        if behind_at is not None and behind_at == view.seq:
            logger.info("replica %s: the view is stuck at event %d of %d; resyncing", replica.url, view.seq, seq)
            view.clear()
            return None
        return view.seq

    # ------------------------------------------------------------ tree events

    async def _follow(self, replica: Replica) -> None:
        sub: zmq.asyncio.Socket | None = None
        address: str | None = None
        try:
            while True:
                if replica.events_address != address:
                    if sub is not None:
                        sub.close(linger=0)
                    sub, address = self._subscribe(replica.events_address), replica.events_address
                if sub is None or not replica.healthy:
                    await asyncio.sleep(self.config.health.interval_s)
                    continue
                if not replica.view.synced:
                    await self._resync(replica)
                if await sub.poll(EVENT_WAIT_MS):
                    self._apply(replica, await sub.recv())
        finally:
            if sub is not None:
                sub.close(linger=0)

    def _subscribe(self, address: str | None) -> zmq.asyncio.Socket | None:
        if address is None:
            return None
        sub = self._zmq.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)  # events wait here while a snapshot is fetched
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(address)
        return sub

    def _apply(self, replica: Replica, frame: bytes) -> None:
        try:
            event = decode(frame)
        except ProtocolError as exc:
            logger.error("dropping a malformed tree event from %s: %s", replica.url, exc)
            return
        if not isinstance(event, TreeEvent):
            logger.error("unexpected %s on the tree events of %s", type(event).__name__, replica.url)
            return
        if not replica.view.apply(event):
            logger.info(
                "replica %s: tree events out of step (%s #%d); resyncing", replica.url, event.instance[:8], event.seq
            )

    async def _resync(self, replica: Replica) -> None:
        """Load the router's snapshot; the events it already covers are skipped as they arrive."""
        try:
            snapshot = await self.get_json(replica, "/cache_blocks", timeout=SNAPSHOT_TIMEOUT_S)
        except (*UPSTREAM_ERRORS, ValueError) as exc:
            logger.warning("replica %s: no cache snapshot: %s", replica.url, exc)
            await asyncio.sleep(self.config.health.interval_s)
            return
        if snapshot.get("protocol") != PROTOCOL_VERSION:
            # its names would match nothing: routed by load alone until both run one version
            if replica.url not in self._other_versions:
                self._other_versions.add(replica.url)
                logger.error(
                    "replica %s names its cached blocks under protocol %s, this gateway under %s: "
                    "run the same radixcluster version on both",
                    replica.url,
                    snapshot.get("protocol", 1),
                    PROTOCOL_VERSION,
                )
            await asyncio.sleep(self.config.health.interval_s)
            return
        self._other_versions.discard(replica.url)
        names = np.frombuffer(base64.b64decode(snapshot["blocks"]), dtype="<u8")
        replica.view.load_snapshot(snapshot["instance"], int(snapshot["seq"]), int(snapshot["page_size"]), names)

    # ------------------------------------------------------------ discovery

    async def _discover(self, target: str) -> None:
        """Keep the replicas equal to the addresses ``HOST:PORT`` resolves to."""
        host, _, port = target.rpartition(":")
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(OSError):
                infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
                found = {_url(str(info[4][0]), int(port)) for info in infos}
                for url in found - set(self._replicas):
                    self.add(url)
                for url in set(self._replicas) - found:
                    await self.remove(url)
            await asyncio.sleep(self.config.discover_interval_s)


def _url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"
