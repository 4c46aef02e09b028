"""Sub-DAG files inlined into the DAG document a client submits.

A ``dag`` node's ``dag: <path>`` names a file relative to the file that holds it. The
API server reads no file of a submission, so a client submitting a DAG *file* sends the
document with every such path replaced by the file's document (recursively), as the
``dag`` mapping of the submit body. Only PyYAML is used: the client does not import the
DAG loader (the server validates, with the lines of the files lost; ``ax validate``
reports them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axengine.errors import InputError

if TYPE_CHECKING:
    import yaml

__all__ = ["MAX_SUBDAG_DEPTH", "has_subdag_files", "inline_subdags"]

#: Deepest nesting of sub-DAG files followed (the server's bound too).
MAX_SUBDAG_DEPTH = 8


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """``yaml.safe_load``'s loader, with dates kept as the text written (as the DAG
    loader keeps them: the submitted mapping is JSON). PyYAML is imported on first use:
    ``import axengine.client`` stays light."""
    import yaml

    class SafeLoader(yaml.SafeLoader):
        pass

    def as_text(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        return loader.construct_scalar(node)  # type: ignore[arg-type]

    SafeLoader.add_constructor("tag:yaml.org,2002:timestamp", as_text)
    return SafeLoader


def _parse(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=_loader())


def _dag_nodes(doc: Any) -> list[Mapping[str, Any]]:
    """The ``dag`` nodes of a document (not of its inline sub-DAGs)."""
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    if not isinstance(nodes, Mapping):
        return []
    return [n for n in nodes.values() if isinstance(n, Mapping) and n.get("type") == "dag"]


def has_subdag_files(doc: Any) -> bool:
    """Whether a parsed document (or one of its inline sub-DAGs) names a sub-DAG file."""
    for node in _dag_nodes(doc):
        value = node.get("dag")
        if isinstance(value, str) or has_subdag_files(value):
            return True
    return False


def inline_subdags(text: str, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The document ``text`` of file ``path`` with each sub-DAG file inlined, or None
    when it names no sub-DAG file (or is not a YAML mapping: the server says why).

    Raises:
        InputError: A sub-DAG file does not exist, cannot be read or parsed, or the
            sub-DAGs recurse or nest deeper than :data:`MAX_SUBDAG_DEPTH`.
    """
    import yaml

    try:
        doc = _parse(text)
    except yaml.YAMLError:
        return None  # sent as text: the server reports the syntax error with its line
    if not isinstance(doc, dict) or not has_subdag_files(doc):
        return None
    real = os.path.realpath(path)
    _inline(doc, Path(path).parent, (real,), 0, os.path.dirname(real))
    return doc


def _inline(doc: Any, base: Path, chain: tuple[str, ...], depth: int, top: str) -> None:
    """Replace, in place, each sub-DAG path of ``doc`` (relative to ``base``)."""
    for node in _dag_nodes(doc):
        assert isinstance(node, dict)
        value = node.get("dag")
        if isinstance(value, Mapping):
            _check_depth(depth + 1, str(chain[-1]))
            _inline(value, base, chain, depth + 1, top)
        elif isinstance(value, str):
            _check_depth(depth + 1, str(chain[-1]))
            node["dag"] = _load(base / value, value, chain, depth + 1, top)


def _check_depth(depth: int, file: str) -> None:
    if depth > MAX_SUBDAG_DEPTH:
        raise InputError(f"sub-DAGs are nested more than {MAX_SUBDAG_DEPTH} levels deep "
                         f"(in {file})")


def _load(path: Path, written: str, chain: tuple[str, ...], depth: int, top: str) -> Any:
    real = os.path.realpath(path)
    if real in chain:
        names = " -> ".join(os.path.relpath(p, top) for p in (*chain, real))
        raise InputError(f"recursive sub-DAG: {names}")
    looked = os.path.abspath(path)
    if not path.exists():
        raise InputError(f"sub-DAG file {written} does not exist (looked for {looked}; "
                         f"named in {chain[-1]})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InputError(f"sub-DAG file {written} cannot be read: {why} (looked for "
                         f"{looked})") from exc
    import yaml

    try:
        doc = _parse(text)
    except yaml.YAMLError as exc:
        raise InputError(f"sub-DAG file {looked} is not valid YAML: {exc} (run "
                         f"`ax validate {looked}`)") from exc
    _inline(doc, path.parent, (*chain, real), depth, top)
    return doc
