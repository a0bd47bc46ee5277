"""The ownership rules of docs/ARCHITECTURE.md §2, checked on every module's imports (parsed,
never imported): who may import whom, and where torch may appear."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from support.package_tree import REPO, modules, package_dirs

# The vocabulary every process shares: the wire protocol, what a model is, what the CPU is.
VOCABULARY = (
    "radixcluster.protocol",
    "radixcluster.model_config",
    "radixcluster.model_path",
    "radixcluster.block_hash",
    "radixcluster.cache_info_fields",
    "radixcluster.gguf_file",
    "radixcluster.cpu_info",
    "radixcluster.log_format",
)


@dataclass(frozen=True, slots=True)
class Rule:
    """Modules under ``owner`` may import, of ours, only what is under ``allowed``."""

    owner: str
    allowed: tuple[str, ...]
    why: str
    torch: bool = True  # whether torch may be imported


# The most specific owner of a module decides; the top layer of `radixcluster` (the CLI, the
# launcher and Ray, offline generation, replica planning) may import anything.
RULES = (
    Rule("radixcluster.kernels", ("radixcluster.kernels",), "kernels are pure: they import nothing of ours"),
    Rule(
        "radixcluster.worker",
        ("radixcluster.worker", "radixcluster.kernels", *VOCABULARY),
        "workers execute; the router decides",
    ),
    Rule(
        "radixcluster.router",
        ("radixcluster.router", *VOCABULARY),
        "the router decides; it never runs model code or torch",
        torch=False,
    ),
    Rule(
        "radixcluster.router.api",
        ("radixcluster.router.api", "radixcluster", *VOCABULARY),
        "the api process knows messages, not the router's internals, tokens or caches",
        torch=False,
    ),
    Rule("radixcluster.lang", ("radixcluster.lang",), "the frontend language is a client of the HTTP API", torch=False),
    Rule(
        "radixcluster.gateway",
        ("radixcluster.gateway", "radixcluster.router.text", "radixcluster.router.api", "radixcluster", *VOCABULARY),
        "the gateway speaks HTTP to replicas and reads their events: their tokenizer and API, never the router's internals",
        torch=False,
    ),
    Rule(
        "radixcluster.bench", ("radixcluster.bench", "radixcluster.router.text", *VOCABULARY), "the bench is a client"
    ),
    Rule("radixcluster.protocol", VOCABULARY, "the vocabulary depends on nothing above it", torch=False),
    Rule("radixcluster.model_config", VOCABULARY, "the vocabulary depends on nothing above it", torch=False),
    Rule("radixcluster.model_path", VOCABULARY, "the vocabulary depends on nothing above it", torch=False),
    Rule("radixcluster.block_hash", VOCABULARY, "the vocabulary depends on nothing above it", torch=False),
    Rule("radixcluster.cpu_info", VOCABULARY, "the vocabulary depends on nothing above it", torch=False),
)


def _under(name: str, prefix: str) -> bool:
    """``name`` is ``prefix`` or inside it; the bare root matches only itself."""
    return name == prefix or (prefix != "radixcluster" and name.startswith(prefix + "."))


def rule_for(module: str) -> Rule | None:
    owners = [r for r in RULES if _under(module, r.owner)]
    return max(owners, key=lambda r: len(r.owner)) if owners else None


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """Every import of ``path`` (also inside functions and TYPE_CHECKING), resolved to dotted
    names: ``from a import b`` yields ``a.b``, which is what a submodule import loads, and a
    dunder of our root package (``__version__``) is the root itself."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                dunder = base == "radixcluster" and alias.name.startswith("__")
                found.append((node.lineno, base if dunder else f"{base}.{alias.name}"))
    return found


def violations(mods: Iterable[tuple[str, Path]]) -> list[str]:
    """One line per import that breaks a rule."""
    found = []
    for module, path in mods:
        rule = rule_for(module)
        if rule is None:
            continue
        for line, name in imports(module, path):
            ours = name == "radixcluster" or name.startswith("radixcluster.")
            if (ours and not any(_under(name, a) for a in rule.allowed)) or (not rule.torch and _under(name, "torch")):
                found.append(f"{path.name}:{line}: {module} imports {name}: {rule.why}")
    return found


def test_every_import_follows_the_ownership_rules() -> None:
    assert violations(modules()) == []


def test_a_wrong_import_is_caught(tmp_path: Path) -> None:
    kernel = tmp_path / "planted_kernel.py"
    kernel.write_text("from radixcluster.worker.kv_pool import KVPool\n")
    router = tmp_path / "planted_router.py"
    router.write_text("import torch\n\n\ndef f():\n    from ..worker import sampler\n")
    api = tmp_path / "planted_api.py"
    api.write_text("from radixcluster import __version__\nfrom radixcluster.router.cache import radix_tree\n")
    gateway = tmp_path / "planted_gateway.py"
    gateway.write_text(
        "from radixcluster.router.text.tokenizer import Tokenizer\nfrom radixcluster.router import scheduler\n"
    )
    planted = [
        ("radixcluster.kernels.planted", kernel),
        ("radixcluster.router.planted", router),
        ("radixcluster.router.api.planted", api),
        ("radixcluster.gateway.planted", gateway),
    ]
    found = violations([*modules(), *planted])
    assert [v.split(": ", 1)[1].split(":")[0] for v in found] == [
        "radixcluster.kernels.planted imports radixcluster.worker.kv_pool.KVPool",
        "radixcluster.router.planted imports torch",
        "radixcluster.router.planted imports radixcluster.worker.sampler",
        "radixcluster.router.api.planted imports radixcluster.router.cache.radix_tree",
        "radixcluster.gateway.planted imports radixcluster.router.scheduler",
    ]


def test_every_source_folder_is_a_listed_package() -> None:
    """A folder missing from pyproject's package list would be neither installed nor checked."""
    listed = set(package_dirs().values())
    sources = {path.parent for root in listed if root.parent == REPO for path in root.rglob("*.py")}
    assert sources <= listed, sorted(map(str, sources - listed))
