"""One tensor-parallel rank's serving loop: rank 0 takes ForwardBatch frames from the router,
broadcasts them to the other ranks, every rank runs its shard, rank 0 answers with a StepResult.
A step that raises on any rank is reported to the router (RankFailed) and ends the rank's loop:
the group's collectives are out of step, so the launcher replaces the whole group."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import zmq

from radixcluster.protocol import Profile, RankFailed, Shutdown, decode, encode
from radixcluster.worker.fault_injection import Faults
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from radixcluster.worker.parallel import init_tensor_parallel
from radixcluster.worker.step_profiler import StepProfiler

logger = logging.getLogger(__name__)

REPORT_LINGER_MS = 2000  # a failure report still in the socket gets this long to reach the router


@dataclass(slots=True)
class WorkerConfig:
    runner: RunnerConfig
    batch_address: str  # the router binds; rank 0 connects (PULL)
    result_address: str  # the router binds; rank 0 connects (PUSH)
    num_threads: int
    generation: int = 0  # how many groups this replica started before this one
    # the environment this rank's process starts with (OpenMP threads and their cores): set
    # before torch loads, so Ray applies it when it starts the actor's process
    env: dict[str, str] = field(default_factory=dict)


class TPWorker:
    """A rank: loads its shard, then serves frames until Shutdown. Ray wraps it as an actor;
    per-step traffic goes through ZeroMQ and collectives only, never through Ray."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.runner: ModelRunner | None = None
        self._rendezvous: socket.socket | None = None
        self.faults = Faults.for_rank(config.runner.tp_rank, config.generation)
        self.profiler = StepProfiler(config.runner.tp_rank)

    def pid(self) -> int:
        """This rank's process (the launcher kills it directly: a stopped process answers no actor call)."""
        return os.getpid()

    def open_rendezvous(self) -> int:
        """Rank 0: listen on a loopback port for the TP group's rendezvous and return it. The
        socket stays open until ``load`` hands it to the store (no other process can take the
        port in between)."""
        self._rendezvous = socket.socket()
        self._rendezvous.bind(("127.0.0.1", 0))
        self._rendezvous.listen(128)
        return self._rendezvous.getsockname()[1]

    def load(self, port: int) -> None:
        """Join the TP group through rank 0's rendezvous on 127.0.0.1:``port`` (a group lives on
        one node, and nothing of it listens beyond loopback) and load this rank's shard. All
        ranks call it concurrently."""
        cfg = self.config
        self.faults.at_load()
        niceness = os.getpriority(os.PRIO_PROCESS, 0)
        if niceness > 0:
            logger.warning(
                "rank %d computes at nice %d, as its Ray cluster starts workers (start it with "
                "RAY_worker_niceness=0 so that other busy processes do not take its CPU)",
                cfg.runner.tp_rank,
                niceness,
            )
        torch.set_num_threads(cfg.num_threads)
        rank, size = cfg.runner.tp_rank, cfg.runner.tp_size
        rendezvous, self._rendezvous = self._rendezvous, None
        if size > 1:
            backend = "nccl" if cfg.runner.device.startswith("cuda") else "gloo"
            listener = rendezvous.detach() if rendezvous is not None else None
            # the master's socket is ours (bound to loopback); libuv's store would bind its own
            store = dist.TCPStore(
                "127.0.0.1", port, size, is_master=rank == 0, master_listen_fd=listener, use_libuv=False
            )
            os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # gloo's pairs listen on loopback too
            init_tensor_parallel(rank, size, backend=backend, store=store)
        elif rendezvous is not None:
            rendezvous.close()  # a group of one needs no rendezvous
        self.runner = ModelRunner(cfg.runner)

    def serve(self) -> None:
        """Run until the router sends Shutdown, or until a step raises here (reported first)."""
        runner = self.runner
        assert runner is not None, "load() first"
        rank, size = self.config.runner.tp_rank, self.config.runner.tp_size
        ctx: zmq.Context = zmq.Context.instance()
        # rank 0 takes the frames from the router and every rank gets them through a broadcast;
        # every rank can report a failure, rank 0 alone sends results
        pull = ctx.socket(zmq.PULL)
        push = ctx.socket(zmq.PUSH)
        push.connect(self.config.result_address)
        if rank == 0:
            pull.connect(self.config.batch_address)
        served = itertools.count()
        try:
            while True:
                frame = pull.recv() if rank == 0 else b""
                if size > 1:
                    frame = _broadcast_frame(frame, rank)
                msg = decode(frame)
                if isinstance(msg, Shutdown):
                    return
                if isinstance(msg, Profile):
                    self.profiler.apply(msg)
                    continue
                try:
                    self.faults.at_step(next(served))
                    result = runner.step(msg)
                except Exception as exc:
                    logger.error("rank %d: step %d failed:\n%s", rank, msg.step_id, traceback.format_exc())
                    push.send(encode(RankFailed(rank=rank, step_id=msg.step_id, error=f"{type(exc).__name__}: {exc}")))
                    return
                if rank == 0:
                    push.send(encode(result))
        finally:
            pull.close(linger=0)
            push.close(linger=REPORT_LINGER_MS)


def _loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in names if name.startswith("lo")), "lo")


def _broadcast_frame(frame: bytes, rank: int) -> bytes:
    """Rank 0's frame to every rank: its length, then its bytes (gloo/nccl carry tensors only)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    length = torch.tensor([len(frame)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    if rank == 0:
        data = torch.frombuffer(bytearray(frame), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return bytes(data.cpu().numpy()) if rank != 0 else frame
