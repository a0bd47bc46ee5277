"""The project's Python packages as pyproject.toml maps them (folder -> dotted name), and a
tree of links that lays them out under their dotted names for tools that resolve imports by
path (mypy): ``python tests/support/package_tree.py build/typecheck`` builds it."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def package_dirs(repo: Path = REPO) -> dict[str, Path]:
    """Each listed package's dotted name -> its folder."""
    tool = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = tool["package-dir"]
    found = {}
    for package in tool["packages"]:
        root = max((name for name in roots if package == name or package.startswith(name + ".")), key=len)
        rest = package[len(root) :].lstrip(".").split(".") if package != root else []
        found[package] = repo.joinpath(roots[root], *rest)
    return found


def modules(repo: Path = REPO) -> Iterator[tuple[str, Path]]:
    """Every module of every package: its dotted name and its file."""
    for package, folder in package_dirs(repo).items():
        for path in sorted(folder.glob("*.py")):
            yield (package if path.stem == "__init__" else f"{package}.{path.stem}"), path


def build_link_tree(target: Path, repo: Path = REPO) -> Path:
    """Link every module file at the path its dotted name implies; returns the top folder."""
    for name, path in modules(repo):
        parts = name.split(".")
        link = (
            target.joinpath(*parts, "__init__.py")
            if path.stem == "__init__"
            else target.joinpath(*parts[:-1], path.name)
        )
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return target / "radixcluster"


if __name__ == "__main__":
    top = Path(sys.argv[1])
    shutil.rmtree(top, ignore_errors=True)  # links only: their targets stay
    print(build_link_tree(top))
