"""`radixcluster up --dp-size N`: N replicas on the Ray cluster (a private one, or the one at
--ray-address, where they spread over the nodes that can host a TP group), each a
`radixcluster up` of its own run by a Ray actor on its node, and the gateway in front of them
on --host/--port. A replica that exits is started again (same node, same port); the gateway
drops its cache view meanwhile and resyncs when it is back."""

from __future__ import annotations

import logging
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import httpx

from radixcluster.launcher import STOP_GRACE_S, SURVIVOR_GRACE_S, _join_or_kill, _start_process
from radixcluster.model_path import resolve_model_path, resolve_tokenizer_path
from radixcluster.process_tree import kill_survivors, runtime_dir, started_processes
from radixcluster.ray_cluster import RayPlacementError, StopRequested
from radixcluster.replica_plan import machine_cpus
from radixcluster.router.text.chat_template import read_chat_template
from radixcluster.server_args import (
    ServerArgs,
    announce_ready,
    load_tenant_keys,
    local_get,
    local_url,
    replica_argv,
    say,
)
from radixcluster.stop_flag import StopFlag

logger = logging.getLogger("radixcluster")

# what each replica gets from `up` itself rather than from the user's flags
# (the keys go in the environment, out of sight of ps)
REPLICA_OWN_FLAGS = (
    "host",
    "port",
    "dp_size",
    "ray_address",
    "node_ip_address",
    "kv_events_address",
    "api_key",
    "admin_api_key",
)
# exits of one replica in a row (none served STABLE_S before it ended) that end the whole command
MAX_RESTARTS = 5
STABLE_S = 60.0
READY_TIMEOUT_S = 120


@dataclass(slots=True)
class ReplicaExits:
    """One replica's exits in a row: an exit after it served STABLE_S since its last start is
    the first of a new row."""

    serving_since: float
    in_a_row: int = 0

    def exited(self, now: float) -> int:
        """Count an exit at ``now``; the exits in a row, this one included."""
        self.in_a_row = 1 if now - self.serving_since >= STABLE_S else self.in_a_row + 1
        return self.in_a_row

    def back(self, now: float) -> None:
        self.serving_since = now


@dataclass(slots=True, frozen=True)
class ClusterKeys:
    """``api_key``: the replicas' and the gateway's API key; ``own``: the key of the command's
    own calls (the gateway's polls of the replicas, the readiness check)."""

    api_key: str | None
    own: str | None


def cluster_keys(args: ServerArgs) -> ClusterKeys:
    """The user's API key, else the admin key, serves the command's own calls. With tenants' keys
    alone every call needs a tenant's key: the replicas and the gateway then get an API key of
    their own that no client holds."""
    api_key = args.api_key
    if api_key is None and args.admin_api_key is None and args.api_key_file is not None:
        api_key = secrets.token_urlsafe(32)
    return ClusterKeys(api_key, api_key or args.admin_api_key)


def replica_nodes(nodes: list[dict[str, Any]], dp_size: int, tp_size: int, use_gpu: bool, first: str) -> list[str]:
    """The node (IP) of each replica: the live nodes that can host a TP group, the driver's
    node ``first`` first, taken in turn."""
    need = ("GPU", float(tp_size)) if use_gpu else ("CPU", 0.01 * tp_size)
    capable = sorted(
        (n["NodeManagerAddress"] for n in nodes if n.get("Alive") and n["Resources"].get(need[0], 0) >= need[1]),
        key=lambda ip: (ip != first, ip),
    )
    if not capable:
        raise RayPlacementError(
            f"no node of the Ray cluster can host --tp-size {tp_size} (needs {need[0]} {need[1]:g})"
        )
    return [capable[i % len(capable)] for i in range(dp_size)]


class DataParallelLauncher:
    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.actors: list[Any] = []
        self.gateway: BaseProcess | None = None
        self.stopping = StopFlag()
        self.runtime_dir = runtime_dir("dp-")
        self.keys = cluster_keys(args)

    def run(self) -> int:
        self._handle_signals()
        try:
            urls = self._start()
            if not self.stopping.is_set():  # else a signal came as the gateway came up: on to the stop
                announce_ready(self.args.host, self.args.port)
                say(f"radixcluster: {len(urls)} replicas behind the gateway: {' '.join(urls)}")
            return self._supervise()
        except StopRequested:
            return 0
        finally:
            self._stop()

    def _handle_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, *_: object) -> None:
        # as Launcher._on_signal: the start-up looks at it, and gives up before the gateway exists;
        # once it exists it may hold requests, and the stop drains them
        self.stopping.set()

    def _start(self) -> list[str]:
        from radixcluster import ray_cluster

        args = self.args
        private = args.ray_address is None
        # before ray is imported: a private instance's settings are read at import
        # the replicas' logs (their requests' lines, warnings, tracebacks) are the command's
        ray_cluster.start_ray(
            args.ray_address, self.runtime_dir, machine_cpus(1).usable, args.node_ip_address, log_to_driver=True
        )
        import ray

        from radixcluster.gateway.config import GatewayConfig
        from radixcluster.gateway.server import run_gateway
        from radixcluster.replica_actor import ReplicaProcess, ReplicaStartError

        ray_cluster.check_stop(self.stopping)
        use_gpu = args.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
        ips = replica_nodes(ray.nodes(), args.dp_size, args.tp_size, use_gpu, ray.util.get_node_ip_address())
        actor_cls = ray.remote(ReplicaProcess)
        address = ray.get_runtime_context().gcs_address
        argv = replica_argv(args, REPLICA_OWN_FLAGS)
        keys = self.keys
        # a private cluster is this host alone: its replicas listen on loopback, for the gateway
        self.actors = [
            actor_cls.options(num_cpus=0, max_concurrency=2, resources={f"node:{ip}": 0.001}).remote(
                argv, address, ip, "127.0.0.1" if private else ip, keys.api_key, args.admin_api_key
            )
            for ip in ips
        ]
        try:
            urls = ray_cluster.get_or_stop([actor.start.remote() for actor in self.actors], self.stopping)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ReplicaStartError):
                raise exc.cause from None  # its message says why; Ray's traceback of the actor adds nothing
            raise
        model_path = resolve_model_path(args.model_path)
        self.gateway = _start_process(
            run_gateway,
            GatewayConfig(
                host=args.host,
                port=args.port,
                model_path=model_path,
                tokenizer_path=resolve_tokenizer_path(args.tokenizer_path, model_path),
                replicas=urls,
                api_key=keys.api_key,
                replica_api_key=keys.own,
                admin_api_key=args.admin_api_key,
                tenant_keys=load_tenant_keys(args.api_key_file) if args.api_key_file else {},
                chat_template=read_chat_template(args.chat_template),
                log_level=args.log_level,
                shutdown_timeout_s=args.shutdown_timeout,
            ),
        )
        self._wait_gateway_ready(len(urls))
        return urls

    def _wait_gateway_ready(self, replicas: int) -> None:
        """Until the gateway serves and sees every replica available."""
        url = local_url(self.args.host, self.args.port) + "/replicas"
        headers = {"Authorization": f"Bearer {self.keys.own}"} if self.keys.own else {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and not self.stopping.is_set():
            if self.gateway is None or not self.gateway.is_alive():
                raise RuntimeError(f"the gateway process exited (is port {self.args.port} free?)")
            try:
                listed = local_get(url, headers).json()["replicas"]
                if sum(r["available"] for r in listed) == replicas:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        if not self.stopping.is_set():
            raise RuntimeError(f"the gateway did not see all {replicas} replicas within {READY_TIMEOUT_S} s")

    def _supervise(self) -> int:
        """Restart a replica that exits; end when the gateway does or a replica keeps dying: more
        than MAX_RESTARTS exits in a row, each within STABLE_S of its start (one that served
        longer starts the count again, as an occasional kill over a long life must not add up)."""
        import ray

        watching = {actor.wait.remote(): i for i, actor in enumerate(self.actors)}
        restarting: dict[Any, int] = {}
        exits = [ReplicaExits(time.monotonic()) for _ in self.actors]
        while not self.stopping.wait(0.5):
            if self.gateway is not None and not self.gateway.is_alive():
                logger.error("the gateway process exited (code %s); shutting down", self.gateway.exitcode)
                return 1
            done, _ = ray.wait([*watching, *restarting], num_returns=1, timeout=0)
            for ref in done:
                if ref in watching:
                    i = watching.pop(ref)
                    in_a_row = exits[i].exited(time.monotonic())
                    logger.error("replica %d exited (code %s); restart %d", i, ray.get(ref), in_a_row)
                    if in_a_row > MAX_RESTARTS:
                        logger.error("replica %d exited %d times in a row; shutting down", i, in_a_row)
                        return 1
                    restarting[self.actors[i].start.remote()] = i
                else:
                    i = restarting.pop(ref)
                    try:
                        logger.warning("replica %d is back at %s", i, ray.get(ref))
                        exits[i].back(time.monotonic())
                    except ray.exceptions.RayTaskError as exc:
                        logger.error("replica %d did not restart: %s", i, exc)
                        return 1
                    watching[self.actors[i].wait.remote()] = i
        return 0

    def _stop(self) -> None:
        import ray

        # the gateway first: it drains while the replicas still serve, which then have nothing in flight
        drain_s = self.args.shutdown_timeout + STOP_GRACE_S
        if self.gateway is not None and self.gateway.is_alive():
            self.gateway.terminate()
            _join_or_kill(self.gateway, drain_s)
        started = started_processes()
        if ray.is_initialized():
            try:
                ray.get([actor.stop.remote(drain_s) for actor in self.actors], timeout=drain_s + STOP_GRACE_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                logger.warning("stopping the replicas: %s", exc)
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            ray.shutdown()
        kill_survivors(started, SURVIVOR_GRACE_S)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
