"""The `radixcluster` command: `up` serves over HTTP (one replica, or several behind a gateway),
`gateway` fronts replicas that run elsewhere, `generate` runs one prompt offline, `bench`
measures a live server."""

from __future__ import annotations

import argparse
import logging
import sys

from radixcluster import __version__
from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway_args import add_gateway_args, gateway_config_from_namespace
from radixcluster.model_path import ModelPathError
from radixcluster.process_tree import open_standard_streams, raise_open_file_limit
from radixcluster.ray_cluster import RankStartError, RayPlacementError
from radixcluster.replica_actor import ReplicaStartError
from radixcluster.server_args import add_cli_args, check_port_free, http_url, say, server_args_from_namespace

logger = logging.getLogger("radixcluster")
# below this many open files a server says so at start
FEW_OPEN_FILES = 4096


def warn_of_few_open_files() -> None:
    """A server's open-file limit raised to its hard limit, and a low one said in one line."""
    limit = raise_open_file_limit()
    if limit < FEW_OPEN_FILES:
        logger.warning(
            "open files are limited to %d (ulimit -n): a few hundred clients at once will be refused; "
            "raise the hard limit for more",
            limit,
        )


def _announce_gateway(config: GatewayConfig) -> None:
    """The standalone gateway's line once it listens, on stdout as `up`'s ready line."""
    over = f"the addresses of {config.discover}" if config.discover else f"{len(config.replicas)} replica(s)"
    say(f"radixcluster gateway ready: {http_url(config.host, config.port)}, routing over {over}", sys.stdout)


def _short_usage(command: str) -> str:
    # argparse's own usage lists every flag: ~60 lines above a bad value's one-line error
    return f"radixcluster {command} [flags] (radixcluster {command} --help lists them)"


def _parser(with_bench_args: bool) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and its subcommands' by name. The bench client is imported only for
    `radixcluster bench`: `up` never pays for it."""
    parser = argparse.ArgumentParser(prog="radixcluster", description=__doc__)
    parser.add_argument("--version", action="version", version=f"radixcluster {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", usage=_short_usage("up"), help="serve a model over HTTP (SGLang- and OpenAI-compatible)")
    add_cli_args(up)
    gateway = sub.add_parser(
        "gateway", usage=_short_usage("gateway"), help="route requests over replicas by what their radix caches hold"
    )
    add_gateway_args(gateway)
    gen = sub.add_parser("generate", help="generate from one prompt, offline, on this machine")
    gen.add_argument("prompt")
    gen.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    bench = sub.add_parser(
        "bench", usage=_short_usage("bench"), help="benchmark a live server (throughput, latency, prefix reuse)"
    )
    if with_bench_args:
        from radixcluster.bench.cli import add_bench_args

        add_bench_args(bench)
    return parser, sub.choices


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    open_standard_streams()
    parser, commands = _parser(with_bench_args=argv[:1] == ["bench"])
    ns, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand whose flags they were meant for, if any came after it (exit 2)
        owner = commands[ns.command] if argv.index(unknown[0]) > argv.index(ns.command) else parser
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if ns.command == "up":
            from radixcluster.launcher import launch
            from radixcluster.log_format import configure_logging

            configure_logging(ns.log_level)
            warn_of_few_open_files()
            args = server_args_from_namespace(ns)
            check_port_free(args.host, args.port)
            if args.kv_events_address is not None:
                check_port_free(*args.events_endpoint(), name="the --kv-events-address port")
            launch(args)
        if ns.command == "gateway":
            from radixcluster.gateway.server import run_gateway

            warn_of_few_open_files()
            config = gateway_config_from_namespace(ns)
            check_port_free(config.host, config.port)
            run_gateway(config, on_listening=lambda: _announce_gateway(config))
            return 0
        if ns.command == "bench":
            from radixcluster.bench.cli import main as bench_main

            return bench_main(ns)
        from radixcluster.offline import generate

        print(generate(ns.prompt, ns.model_path, ns.max_new_tokens, ns.temperature, chat=not ns.raw))
        return 0
    except (ModelPathError, RankStartError, RayPlacementError, ReplicaStartError, ValueError) as exc:
        print(f"radixcluster: error: {exc}", file=sys.stderr)
        return 2
