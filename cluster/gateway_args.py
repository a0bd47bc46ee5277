"""The flags of `radixcluster gateway`: where it listens, the replicas it fronts, how it routes."""

from __future__ import annotations

import argparse
import os

from radixcluster.gateway.config import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    MAX_WAIT_S,
    POLICIES,
    GatewayConfig,
    HealthTunables,
    RoutingTunables,
    replica_url_problem,
)
from radixcluster.model_path import resolve_model_path, resolve_tokenizer_path
from radixcluster.router.text.chat_template import read_chat_template
from radixcluster.server_args import (
    ADMIN_API_KEY_ENV,
    API_KEY_ENV,
    LOG_LEVELS,
    check_listen_address,
    load_tenant_keys,
)


def add_gateway_args(parser: argparse.ArgumentParser) -> None:
    routing, health = RoutingTunables(), HealthTunables()
    parser.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="URL",
        help="a replica's base URL (`radixcluster up --kv-events-address ...`); repeat for each",
    )
    parser.add_argument(
        "--discover",
        default=None,
        metavar="HOST:PORT",
        help="the replicas are the addresses HOST resolves to (e.g. a Kubernetes headless Service), port PORT",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (all but /health); ${API_KEY_ENV} sets it without showing it in ps",
    )
    parser.add_argument(
        "--admin-api-key",
        default=None,
        help=f"the replicas' admin key: the cache-control calls need it; ${ADMIN_API_KEY_ENV} sets it without showing it in ps",
    )
    parser.add_argument(
        "--api-key-file",
        default=None,
        help="the replicas' tenants' keys (their --api-key-file): prompts are routed within each tenant's cache",
    )
    parser.add_argument(
        "--replica-api-key",
        default=None,
        help="the key of the gateway's own calls to the replicas (default: --api-key, else --admin-api-key); "
        "with --admin-api-key or --api-key-file each client's key goes on with its generations and cache calls",
    )
    parser.add_argument(
        "--model-path", "--model", default=None, help="the replicas' model, for its tokenizer (default: embedded)"
    )
    parser.add_argument(
        "--tokenizer-path",
        "--tokenizer",
        default=None,
        help="the replicas' --tokenizer-path, if they have one (default: the model's own tokenizer)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="the replicas' --chat-template, if they have one: chats are rendered with it",
    )
    parser.add_argument("--policy", choices=POLICIES, default=routing.policy, help="round-robin: a baseline")
    parser.add_argument(
        "--load-weight",
        type=float,
        default=routing.load_weight,
        help="what one prompt token a replica still has to compute costs, in cached prompt tokens",
    )
    parser.add_argument(
        "--min-overlap",
        type=float,
        default=routing.min_overlap,
        help="below this share of the prompt cached on any replica, go to the least loaded one",
    )
    parser.add_argument("--health-interval", type=float, default=health.interval_s, help="seconds between polls")
    parser.add_argument(
        "--breaker-failures",
        type=int,
        default=health.breaker_failures,
        help="failed requests in a row that take a replica out",
    )
    parser.add_argument(
        "--breaker-cooldown", type=float, default=health.breaker_cooldown_s, help="seconds a replica stays out"
    )
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="warning")
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="seconds that requests in flight get to finish after SIGTERM",
    )


def gateway_config_from_namespace(ns: argparse.Namespace) -> GatewayConfig:
    if not ns.replica and not ns.discover:
        raise ValueError("give the replicas: --replica URL (repeated) or --discover HOST:PORT")
    for url in ns.replica:
        if (problem := replica_url_problem(url)) is not None:
            raise ValueError(f"--replica {url!r}: {problem}")
    if ns.discover and not ns.discover.rpartition(":")[2].isdigit():
        raise ValueError(f"--discover must be HOST:PORT, got {ns.discover!r}")
    if not 0 <= ns.shutdown_timeout <= MAX_WAIT_S:
        raise ValueError(f"--shutdown-timeout must be in [0, {MAX_WAIT_S:g}] s, got {ns.shutdown_timeout}")
    check_listen_address(ns.host, ns.port)
    api_key = ns.api_key or os.environ.get(API_KEY_ENV) or None
    admin_api_key = ns.admin_api_key or os.environ.get(ADMIN_API_KEY_ENV) or None
    tenant_keys = load_tenant_keys(ns.api_key_file) if ns.api_key_file else {}
    model_path = resolve_model_path(ns.model_path)
    replica_api_key = ns.replica_api_key or api_key or admin_api_key
    if tenant_keys and replica_api_key is None:
        raise ValueError(
            "replicas with tenants' keys refuse a call without a key: give the gateway's own one "
            "(--replica-api-key, or --api-key / --admin-api-key)"
        )
    return GatewayConfig(
        host=ns.host,
        port=ns.port,
        model_path=model_path,
        tokenizer_path=resolve_tokenizer_path(ns.tokenizer_path, model_path),
        replicas=list(ns.replica),
        discover=ns.discover,
        api_key=api_key,
        replica_api_key=replica_api_key,
        admin_api_key=admin_api_key,
        tenant_keys=tenant_keys,
        chat_template=read_chat_template(ns.chat_template),
        routing=RoutingTunables(ns.policy, ns.load_weight, ns.min_overlap),
        health=HealthTunables(ns.health_interval, ns.breaker_failures, ns.breaker_cooldown),
        log_level=ns.log_level,
        shutdown_timeout_s=ns.shutdown_timeout,
    )
