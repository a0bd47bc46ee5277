"""Ray's part: start a quiet local instance (or join one), place one TP group on one node, start,
watch and replace the rank actors. Per-step traffic never goes through Ray."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from radixcluster.process_tree import is_running, kill_survivors
from radixcluster.stop_flag import StopFlag

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 60
REACH_TIMEOUT_S = 5  # a --ray-address that takes no TCP connection within this is refused
KILL_GRACE_S = 2  # a rank Ray was told to kill and that still runs after this gets SIGKILL
KILL_WAIT_S = 10  # a killed rank's process is gone within this (SIGKILL, reaped by Ray's raylet)
STOP_POLL_S = 0.5  # how often a wait on Ray looks for a stop request


class RayPlacementError(RuntimeError):
    """The Ray cluster cannot host this TP group."""


class RankStartError(RuntimeError):
    """A rank raised while it loaded its shard; the message is its error, in one line."""


class StopRequested(Exception):
    """SIGTERM or Ctrl-C came while the command waited on Ray."""


def check_stop(stopping: StopFlag) -> None:
    """StopRequested once ``stopping`` is set (the launchers look between their start-up steps)."""
    if stopping.is_set():
        raise StopRequested


def get_or_stop(refs: list[Any], stopping: StopFlag, timeout_s: float | None = None) -> list[Any]:
    """``ray.get(refs)``, given up with StopRequested once ``stopping`` is set (TimeoutError past
    ``timeout_s``); the first failure is raised as soon as it is known (not after the others'
    timeouts). The launchers' signal handlers only set the event: an exception raised from a
    handler inside Ray's blocking calls comes out as a SystemError, or is lost."""
    import ray

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        check_stop(stopping)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} of {len(refs)} Ray calls got no answer within {timeout_s:g} s")
        done, pending = ray.wait(pending, num_returns=1, timeout=STOP_POLL_S)
        ray.get(done)
    return ray.get(list(refs))


@dataclass(slots=True)
class RayWorkers:
    """The started rank actors and what must be torn down with them."""

    actors: list[Any]
    placement_group: Any
    bundle: dict[str, float]
    generation: int = 0  # 0 for the first group, +1 for each replacement
    serve_refs: list[Any] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # the ranks' processes, in rank order


def quiet_ray_env() -> None:
    """No usage stats, no log deduplication, no idle workers started ahead (our actors need their
    own environment, so none would be used) and no Ray metrics (we export our own): on a 2-core
    host every process counts. The rank actors compute at the normal priority: Ray starts its
    workers at nice 15, where beside any other busy process they would get a sliver of the CPU
    (read by the raylet, so it holds for the private instance). No memory monitor: past 95 % of
    the host's memory, whoever holds it, Ray killed the one process it may kill, a rank, and then
    each replacement within a second, until the replica gave up; out of memory is the kernel's
    to settle, as for any server. No color codes around the actor's name that prefixes a line it
    logs to the driver: log collectors read them as text. No "Unhandled error" tracebacks of
    calls whose result nobody read: every result we need is read (and its error said in one
    line); the others are calls a stop cut short (replicas starting when SIGTERM came)."""
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_enable_worker_prestart", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")


def private_ray_env() -> None:
    """A private instance listens on loopback only (Ray binds there when it runs as a
    single-machine cluster; read when ray is imported) and wants a token only this replica's
    processes hold (given in the environment, so no token file lands in the user's home).
    A RAY_ADDRESS left in the environment (a shell after `ray start`, a KubeRay pod) would make
    ray.init join that cluster instead: --ray-address is how to join one."""
    stale = os.environ.pop("RAY_ADDRESS", None)
    if stale:
        logger.warning("RAY_ADDRESS=%s is ignored: this runs a private Ray; --ray-address joins a cluster", stale)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def start_ray(
    address: str | None, temp_dir: str, num_cpus: int, node_ip: str | None = None, log_to_driver: bool = False
) -> None:
    """Join ``address`` (as the node ``node_ip`` of this host; Ray's choice when None) or start
    a private local instance (whose node is ``node_ip`` when given); ``stop_workers`` leaves it.
    The caller's SIGTERM handler stays in place throughout (see ``_signal_handlers_kept``).
    ``log_to_driver``: what the actors write to stderr reaches this process's (else only Ray's
    session logs, which go with the runtime dir)."""
    quiet_ray_env()
    if not address:
        private_ray_env()
    ray = _import_ray_without_failure_handler()
    if not address and ray._private.ray_constants.ENABLE_RAY_CLUSTER:
        raise RuntimeError("ray was imported before start_ray: the private instance would listen beyond loopback")
    if address:
        check_reachable(address)
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        # Token authentication whenever a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
        # or ~/.ray/auth_token) and RAY_AUTH_MODE does not say otherwise: the rule Ray applies
        # to a cluster it finds by itself, and not to an explicit address
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        own: dict[str, Any] = {"address": address}
    else:
        # A private temp dir keeps sessions and sockets of two servers on one host apart.
        own = {"num_cpus": num_cpus, "num_gpus": _num_gpus(), "_temp_dir": temp_dir}
    with _signal_handlers_kept(ray):
        ray.init(
            _node_ip_address=node_ip,
            include_dashboard=False,
            log_to_driver=log_to_driver,
            logging_level=logging.ERROR,
            **own,
        )


def check_reachable(address: str) -> None:
    """RayPlacementError when nothing listens at a HOST:PORT ``address``: ray.init retries such
    an address for ever, deaf to SIGTERM, where this says so in seconds ("auto" and Ray
    client's ray:// are left to Ray)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise RayPlacementError(f"--ray-address {address}: no Ray cluster answers there ({exc})") from None


def _import_ray_without_failure_handler() -> Any:
    """``import ray`` with its failure signal handler off in this process: its core worker would
    otherwise take SIGTERM over at the C level during ray.init, and a stop that came then aborted
    the command. Read once, at import; unset again before ray.init starts Ray's own processes,
    which keep theirs."""
    name = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
    before = os.environ.get(name)
    os.environ[name] = "1"
    try:
        import ray
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
    return ray


@contextlib.contextmanager
def _signal_handlers_kept(ray: Any) -> Iterator[None]:
    """ray.init installs, for the rest of its start-up, a SIGTERM handler that raises SystemExit
    wherever the main thread is: in a fork hook, where Python prints and drops it, the stop was
    lost and the command served on. The caller's handler (which sets a flag the start-up checks)
    stays in place instead."""
    utils = ray._private.utils
    install = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = install


def _num_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_workers(worker_configs: list[Any], use_gpu: bool, timeout_s: float = PLACEMENT_TIMEOUT_S) -> RayWorkers:
    """One actor per rank, all in one STRICT_PACK placement group on the driver's node.

    On CPU the bundles are fractional so that ``--tp-size 3`` fits two cores.
    """
    import ray
    from ray.util.placement_group import placement_group

    tp_size = len(worker_configs)
    bundle: dict[str, float] = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 0.01}
    # The router reaches rank 0 over ipc://, so the group lives on this (the driver's) node.
    node = f"node:{ray.util.get_node_ip_address()}"
    _check_node_can_host(node, bundle, tp_size)
    bundle[node] = 0.001
    pg = placement_group([dict(bundle) for _ in range(tp_size)], strategy="STRICT_PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise RayPlacementError(
            f"Ray cannot place {tp_size} x {bundle} on one node within {timeout_s:.0f}s; "
            f"cluster resources: {ray.cluster_resources()}"
        )
    return _start_actors(pg, bundle, worker_configs, generation=0)


def _start_actors(pg: Any, bundle: dict[str, float], worker_configs: list[Any], generation: int) -> RayWorkers:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from radixcluster.worker.worker_process import TPWorker

    actor_cls = ray.remote(TPWorker)
    actors = [
        actor_cls.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            resources={key: value for key, value in bundle.items() if key.startswith("node:")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
            runtime_env={"env_vars": cfg.env} if cfg.env else None,
        ).remote(cfg)
        for i, cfg in enumerate(worker_configs)
    ]
    return RayWorkers(actors=actors, placement_group=pg, bundle=bundle, generation=generation)


def replace_workers(old: RayWorkers, worker_configs: list[Any]) -> RayWorkers:
    """Kill group ``old`` (what is left of it) and start the next generation's actors in its
    placement group, whose bundles the dead ones give back; ``load_and_serve`` them next."""
    kill_actors(old)
    return _start_actors(old.placement_group, old.bundle, worker_configs, old.generation + 1)


def _check_node_can_host(node: str, bundle: dict[str, float], tp_size: int) -> None:
    """Fail at once, not after a placement timeout, when this node could never hold the group."""
    import ray

    totals = next((n["Resources"] for n in ray.nodes() if n.get("Alive") and node in n["Resources"]), None)
    if totals is None:
        raise RayPlacementError(f"this machine ({node[5:]}) is not a live node of the Ray cluster")
    short = {k: (v * tp_size, totals.get(k, 0)) for k, v in bundle.items() if totals.get(k, 0) < v * tp_size}
    if short:
        need = ", ".join(f"{k} {want:g} (node has {have:g})" for k, (want, have) in short.items())
        raise RayPlacementError(f"the Ray node {node[5:]} cannot host --tp-size {tp_size}: it needs {need}")


def load_and_serve(workers: RayWorkers, stopping: StopFlag) -> None:
    """Load every rank's shard (concurrently: they rendezvous), then start their serving loops,
    whose object refs go to ``workers.serve_refs`` (one finishing means its rank stopped).
    Raises RankStartError for what a rank's load raised or for ranks that did not start, a Ray
    error when its process died, or StopRequested."""
    import ray

    try:
        # a rank's process that does not start (Ray's raylet gone) would hold this for ever
        workers.pids = get_or_stop([actor.pid.remote() for actor in workers.actors], stopping, PLACEMENT_TIMEOUT_S)
    except TimeoutError:
        raise RankStartError(
            f"the TP ranks' processes did not start within {PLACEMENT_TIMEOUT_S} s: is Ray's node (its raylet) alive?"
        ) from None
    [port] = get_or_stop([workers.actors[0].open_rendezvous.remote()], stopping)
    try:
        get_or_stop([actor.load.remote(port) for actor in workers.actors], stopping)
    except ray.exceptions.RayTaskError as exc:
        raise RankStartError(f"a TP rank could not load the model: {first_line(exc)}") from None
    workers.serve_refs = [actor.serve.remote() for actor in workers.actors]


def _ended_ranks(workers: RayWorkers) -> tuple[list[str], list[str]]:
    """Why the ranks whose serving loops have ended ended: those whose process died, and the
    others (a step failed there)."""
    import ray

    done, _ = ray.wait(workers.serve_refs, num_returns=len(workers.serve_refs), timeout=0)
    died, failed = [], []
    for ref in done:
        rank = workers.serve_refs.index(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            died.append(f"rank {rank} died ({first_line(exc)})")
        except ray.exceptions.RayError as exc:
            failed.append(f"rank {rank} failed ({first_line(exc)})")
        else:
            failed.append(f"rank {rank} left its loop after a failed step")
    return died, failed


def stopped_rank(workers: RayWorkers) -> str | None:
    """Which rank's serving loop has ended and why, or None while every rank serves. A rank
    whose process died is named first: its peers' loops end too, on a collective that lost it
    (gloo's "Connection reset by peer" on rank 0 when rank 2 was killed)."""
    died, failed = _ended_ranks(workers)
    return next(iter(died + failed), None)


def dead_rank(workers: RayWorkers) -> str | None:
    """A rank whose process died, and how, or None."""
    return next(iter(_ended_ranks(workers)[0]), None)


def first_line(exc: BaseException) -> str:
    """An exception in one line: a rank's (Ray's carry the remote traceback below, after a
    line naming the call), its own error's first line."""
    cause = getattr(exc, "cause", None)  # a RayTaskError's: what the rank raised
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {first_line(cause)}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def kill_actors(workers: RayWorkers) -> None:
    """Kill every rank of the group and wait for their processes to be gone: through Ray, and
    with SIGKILL to the processes themselves, since a stopped or hung one answers nothing."""
    import ray

    for actor in workers.actors:
        ray.kill(actor, no_restart=True)
    # Ray's kill is quiet (a SIGKILL behind its back makes the raylet report a crash); what it
    # cannot end within the grace gets SIGKILL
    kill_survivors(set(workers.pids), KILL_GRACE_S)
    end = time.monotonic() + KILL_WAIT_S
    while any(is_running(pid) for pid in workers.pids) and time.monotonic() < end:
        time.sleep(0.05)


def stop_workers(workers: RayWorkers | None) -> None:
    """Kill our actors and placement group, then leave Ray: a local instance this process
    started stops with it; a joined cluster keeps running."""
    import ray

    if not ray.is_initialized():
        return
    if workers is not None:
        kill_actors(workers)
        ray.util.remove_placement_group(workers.placement_group)
    ray.shutdown()
