"""YAML (or an inline mapping) → validated :class:`Dag`, with file:line for every problem.

Reading happens in three steps, each collecting problems instead of stopping:

1. :class:`_TreeBuilder` composes the YAML with a safe loader (libyaml when available)
   and builds dicts/lists from the node graph itself, so it keeps the line of every key
   and value, rejects duplicate keys (PyYAML silently keeps the last one), bounds the
   expanded size (alias bombs) and spots the classic unquoted ``{{ ... }}``.
2. :class:`~axengine.dag._schema.DagBuilder` checks the document and every node field,
   applies defaults and builds the :class:`Node` values.
3. :func:`~axengine.dag._validate.check_dag` checks the whole graph and the templates.

A DAG with any problem raises :class:`~axengine.errors.DagError` listing all of them.

A ``dag`` node's ``dag:`` is its sub-DAG: a document inline (a mapping, loaded as a DAG
of its own, problems in the parent's file with node ids ``{dag node}/{child id}``) or
the path of a file, relative to the directory of the file that names it. Files are read
only when the DAG itself is loaded from a file (:func:`load_dag`, :func:`validate_file`):
text and mappings come from API submissions, which must not read the server's files.
A sub-DAG file's problems are reported with its own file and lines; recursion and
nesting deeper than :data:`MAX_SUBDAG_DEPTH` are refused at the ``dag:`` line.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import re
import sys
import threading
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.nodes import Node as YamlNode

from axengine.dag._model import Dag
from axengine.dag._schema import MAX_DAG_NODES, DagBuilder, LineList, LineMap, Pos
from axengine.dag._validate import check_dag
from axengine.errors import DagError, DagProblem

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_SUBDAG_DEPTH",
    "MAX_YAML_NODES",
    "load_dag",
    "load_dag_mapping",
    "load_dag_text",
    "validate_file",
]

#: Largest DAG document accepted, in bytes.
MAX_DOCUMENT_BYTES = 2 * 1024 * 1024
#: Most YAML values (scalars, lists, mappings) after alias expansion.
MAX_YAML_NODES = 500_000
#: Deepest nesting of lists and mappings.
MAX_DEPTH = 64
#: Deepest nesting of sub-DAGs (a DAG's sub-DAG is at level 1).
MAX_SUBDAG_DEPTH = 8

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float"))
_STR_TAG, _SEQ_TAG, _MAP_TAG = _TAG + "str", _TAG + "seq", _TAG + "map"
_NULL_TAG, _MERGE_TAG, _TIMESTAMP_TAG = _TAG + "null", _TAG + "merge", _TAG + "timestamp"
# A value that starts with "{{" or "{%" right after "key:", "-", "[" or ",".
_UNQUOTED = re.compile(r"(?:^|[:\[,-])\s*(\{[{%].*[}%]\})")
_KEY = re.compile(r"^\s*(?:-\s+)?([A-Za-z_][\w.-]*)\s*:\s")
# What YAML counts as a line break (str.splitlines() also splits on \v, \f, ...).
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """The safe loader (libyaml's when available), used to compose only.

    Implicit scalar tags depend on the text alone, and a DAG repeats the same few words
    (``type``, ``tool_call``, ``next``...) thousands of times: memoising the tag of
    each plain scalar halves the composing time of a large DAG. Any other node gets the
    default tag of its kind, memoised too: the safe loader has no path resolvers, which
    is also why descending and ascending them (twice per node) can do nothing at all.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._scalar_tags: dict[str, str] = {}
        self._kind_tags: dict[type[YamlNode], str] = {}

    def resolve(self, kind: type[YamlNode], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is not ScalarNode or not implicit[0]:
            tag = self._kind_tags.get(kind)
            if tag is None:
                tag = self._kind_tags[kind] = str(super().resolve(kind, value, implicit))
            return tag
        tag = self._scalar_tags.get(value)
        if tag is None:
            tag = self._scalar_tags[value] = str(super().resolve(kind, value, implicit))
        return tag

    def descend_resolver(self, current_node: YamlNode | None, current_index: Any) -> None:
        pass

    def ascend_resolver(self) -> None:
        pass


class _Abort(Exception):
    """Reading cannot go on (syntax error, size bound); carries the problem."""

    def __init__(self, problem: DagProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _TreeBuilder:
    """Builds annotated dicts/lists from a composed YAML node graph."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.problems: list[DagProblem] = []
        self.count = 0
        self.constructor = SafeConstructor()
        #: Values of the non-string scalars met, by (tag, text): a DAG repeats a few.
        self._constants: dict[tuple[str, str], Any] = {}
        self._lines: list[str] | None = None

    def line_text(self, number: int) -> str:
        """Text of 1-based line ``number`` (empty past the end)."""
        if self._lines is None:
            self._lines = _LINE_BREAK.split(self.text)
        return self._lines[number - 1] if 0 < number <= len(self._lines) else ""

    def parse(self) -> Any:
        loader = _Loader(self.text)
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise _Abort(self._syntax_problem(exc)) from exc
        except yaml.YAMLError as exc:
            problem = DagProblem(f"YAML error: {exc}", self.file, 0, code="yaml-syntax")
            raise _Abort(problem) from exc
        except RecursionError as exc:
            raise _Abort(self._too_deep(0)) from exc
        finally:
            loader.dispose()
        if root is None:
            return None
        return self.build(root, 0)

    def _syntax_problem(self, exc: yaml.MarkedYAMLError) -> DagProblem:
        marks = [m.line for m in (exc.context_mark, exc.problem_mark) if m is not None]
        line = marks[-1] + 1 if marks else 0
        what = exc.problem or exc.context or "invalid YAML"
        if "nesting depth" in what:
            return self._too_deep(line)
        # The template is usually on the error's line or on the line its context opened.
        for number in range(min(marks, default=0) + 1, line + 1):
            found = _UNQUOTED.search(self.line_text(number))
            if found:
                return self._unquoted(number, found.group(1), self.line_text(number),
                                      f"YAML cannot parse it ({what})")
        return DagProblem(
            f"YAML syntax error: {what}", self.file, line, code="yaml-syntax",
            hint="check indentation, and quote values that contain ': ', '#', '{' or '['",
        )

    def _unquoted(self, line: int, tmpl: str, source_line: str, what: str) -> DagProblem:
        key = _KEY.match(source_line)
        example = f"{key.group(1)}: {json.dumps(tmpl)}" if key else json.dumps(tmpl)
        return DagProblem(
            f"unquoted template {tmpl}: {what}",
            self.file, line, field=key.group(1) if key else None,
            hint=f"quote the template: {example}", code="unquoted-template",
        )

    def _too_deep(self, line: int) -> DagProblem:
        return DagProblem(
            f"document is nested deeper than {MAX_DEPTH} levels", self.file, line,
            code="too-large",
        )

    def build(self, node: YamlNode, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_YAML_NODES:
            raise _Abort(DagProblem(
                f"document has more than {MAX_YAML_NODES} values (after expanding aliases)",
                self.file, node.start_mark.line + 1, code="too-large",
            ))
        if depth > MAX_DEPTH:
            raise _Abort(self._too_deep(node.start_mark.line + 1))
        if isinstance(node, ScalarNode):
            return node.value if node.tag == _STR_TAG else self._scalar(node)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self._unsupported(node)
            seq = LineList(node.start_mark.line + 1)
            for item in node.value:
                seq.append(self.build(item, depth + 1))
                seq.item_pos.append(_pos(item))
            return seq
        assert isinstance(node, MappingNode)
        return self._mapping(node, depth)

    def _scalar(self, node: ScalarNode) -> Any:
        if node.tag == _STR_TAG:
            return node.value
        if node.tag in _SCALAR_TAGS:
            constant = (node.tag, node.value)
            if constant in self._constants:
                value = self._constants[constant]
            else:
                try:
                    value = self.constructor.construct_object(node)
                except ValueError:  # an integer past Python's 4,300 digits
                    self.problems.append(DagProblem(
                        f"a number of {len(node.value):,} characters is more than Python "
                        f"reads ({sys.get_int_max_str_digits()} digits)", self.file,
                        node.start_mark.line + 1, code="too-large",
                        hint="quote it to keep it as text"))
                    return node.value
                self._constants[constant] = value
            if isinstance(value, float) and not math.isfinite(value):
                self.problems.append(_not_json_number(node.value, self.file,
                                                      node.start_mark.line + 1))
            return value
        if node.tag == _TIMESTAMP_TAG:
            return node.value  # dates stay text: the stored DAG is JSON
        self._unsupported(node)
        return node.value

    def _unsupported(self, node: YamlNode) -> None:
        self.problems.append(DagProblem(
            f"unsupported YAML tag {node.tag!r}", self.file, node.start_mark.line + 1,
            code="yaml-syntax", hint="use plain strings, numbers, lists and mappings",
        ))

    def _mapping(self, node: MappingNode, depth: int) -> Any:
        line = node.start_mark.line + 1
        pairs = node.value
        if (
            len(pairs) == 1 and isinstance(pairs[0][0], MappingNode)
            and isinstance(pairs[0][1], ScalarNode) and pairs[0][1].tag == _NULL_TAG
        ):
            # `key: {{ .x }}` reads as {{".x": null}: null}; keep the text so the
            # other checks see the string that was meant.
            source = self.text[node.start_mark.index:node.end_mark.index]
            self.problems.append(self._unquoted(
                line, source, self.line_text(line), "YAML reads it as a mapping, not a string"
            ))
            return source
        if node.tag != _MAP_TAG:
            self._unsupported(node)
        result = LineMap(line)
        key_lines, value_pos = result.key_lines, result.value_pos
        merges: list[YamlNode] = []
        for key_node, value_node in pairs:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode):
                self.problems.append(DagProblem(
                    "a mapping key must be a plain name, not a list or mapping",
                    self.file, key_line, code="yaml-syntax",
                    hint="quote the key, or a template used as a value",
                ))
                continue
            key = str(key_node.value)
            if key in result:
                self.problems.append(DagProblem(
                    f"duplicate key {key!r} (first at line {result.key_lines[key]}); "
                    "YAML would silently keep only the last one",
                    self.file, key_line, field=key, code="duplicate-key",
                    hint="remove or rename one of them",
                ))
                continue
            if (isinstance(value_node, ScalarNode) and value_node.tag == _STR_TAG
                    and self.count < MAX_YAML_NODES and depth < MAX_DEPTH):
                # Most values are strings: what build() does with one, without the call.
                self.count += 1
                result[key] = value_node.value
            else:
                result[key] = self.build(value_node, depth + 1)
            key_lines[key] = key_line
            value_pos[key] = _pos(value_node)
        for merge in merges:  # `<<: *defaults`: explicit keys win, earlier merges win
            sources = merge.value if isinstance(merge, SequenceNode) else [merge]
            for merge_source in sources:
                merged = self.build(merge_source, depth + 1)
                if not isinstance(merged, LineMap):
                    self.problems.append(DagProblem(
                        "`<<` must merge a mapping", self.file, line, code="yaml-syntax",
                    ))
                    continue
                for key, value in merged.items():
                    if key not in result:
                        result[key] = value
                        result.key_lines[key] = merged.key_lines[key]
                        result.value_pos[key] = merged.value_pos[key]
        return result


def _pos(node: YamlNode) -> Pos:
    """Where a value's content starts, and whether its lines are the file's lines."""
    start = node.start_mark.line + 1
    if isinstance(node, ScalarNode):
        style = node.style
        if style == "|" or style == ">":
            return start + 1, style == "|"
        # A one-line "...\n..." holds several template lines on one file line.
        return start, node.end_mark.line + 1 == start and "\n" not in node.value
    return start, node.end_mark.line + 1 == start


def _measure(data: Any, file: str) -> DagProblem | None:
    """Bound size and depth of an inline mapping (what the YAML reader bounds)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            return DagProblem(f"document has more than {MAX_YAML_NODES} values", file,
                              code="too-large")
        if depth > MAX_DEPTH:
            return DagProblem(f"document is nested deeper than {MAX_DEPTH} levels", file,
                              code="too-large")
        if isinstance(value, Mapping):
            for key in value:
                if isinstance(key, str) and _not_text(key):
                    return _not_unicode(key, file, 0)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, str):
            if _not_text(value):
                return _not_unicode(value, file, 0)
        elif isinstance(value, list | tuple):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, float) and not math.isfinite(value):
            return _not_json_number(repr(value), file, 0)
        elif not isinstance(value, str | int | float | bool | None):
            return DagProblem(f"a {type(value).__name__} is not a JSON value", file,
                              code="yaml-syntax",
                              hint="use strings, numbers, booleans, null, lists and mappings")
    return None


def _not_text(value: str) -> bool:
    """Whether ``value`` holds a lone surrogate (``"\\ud800"``: a JSON escape can spell
    one, UTF-8 cannot store it; the YAML reader refuses the escape itself)."""
    if value.isascii():
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def _not_unicode(value: str, file: str, line: int) -> DagProblem:
    shown = value.encode("utf-8", "backslashreplace").decode()
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return DagProblem(f"'{shown}' is not valid Unicode text (a lone surrogate)", file, line,
                      code="yaml-syntax", hint="remove the \\ud800-\\udfff escape")


def _not_json_number(text: str, file: str, line: int) -> DagProblem:
    return DagProblem(f"{text} is not a JSON number (JSON has no NaN or infinity)", file,
                      line, code="yaml-syntax", hint="quote it to keep it as text")


def _known(names: Collection[str] | None, which: str) -> Collection[str]:
    if names is not None:
        return frozenset(names)
    # Imported lazily: the registry pulls in every tool and model handler.
    from executors import registry

    # The handlers' settings of this process's configuration (ax.toml, AX_*): the
    # tool modules and model endpoints it names are known to the validator too.
    settings = _handler_settings()
    if which == "tool":
        return registry.tool_names(settings)
    return registry.model_names(settings.get("llm"))


@functools.cache
def _handler_settings() -> Mapping[str, Any]:
    from axengine.config import AxConfig

    return AxConfig.from_env().resolved_handler_settings


class _CollectorPause:
    """Pauses Python's cyclic garbage collector while DAGs load, in any thread.

    Loading a large DAG allocates hundreds of thousands of objects that all stay alive
    until it ends (the YAML node graph, then the tree and the nodes), and the collector
    runs full collections over all of them as they pile up: for 10,000 nodes that was
    over half of the loading time, to free nothing (what a load drops goes by reference
    counting; anything cyclic, such as an exception's traceback, is collected once the
    collector runs again). The first load in progress pauses the collector and the last
    one resumes it, unless it was already off when the first started.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads = 0
        self._resume = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._loads == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._loads += 1
        try:
            yield
        finally:
            with self._lock:
                self._loads -= 1
                if self._loads == 0 and self._resume:
                    gc.enable()


_collector_paused = _CollectorPause()


@dataclass(frozen=True)
class _Context:
    """What one load (a DAG and its sub-DAGs) shares, and where a document sits in it."""

    #: Tool and model names as given (None: the registry's), and those resolved.
    tools: Collection[str] | None
    models: Collection[str] | None
    known: dict[str, Collection[str]] = field(default_factory=dict)
    #: Directory sub-DAG paths are relative to; None when the DAG was not loaded from
    #: a file (then no file is read).
    base_dir: str | None = None
    #: Real paths of the files being loaded, outermost first (to refuse recursion).
    chain: tuple[str, ...] = ()
    #: Sub-DAG level of the document (0: the DAG loaded).
    depth: int = 0
    #: Nodes loaded so far in sub-DAGs (one counter for the whole load).
    loaded: list[int] = field(default_factory=lambda: [0])

    def names(self, which: str) -> Collection[str]:
        found = self.known.get(which)
        if found is None:
            given = self.tools if which == "tool" else self.models
            found = self.known[which] = _known(given, which)
        return found

    def shown(self, real: str) -> str:
        """A file of the chain as messages name it: relative to the first file's."""
        if not self.chain:
            return real
        return os.path.relpath(real, os.path.dirname(self.chain[0]))


def _file_context(
    path: str, tools: Collection[str] | None, models: Collection[str] | None
) -> _Context:
    return _Context(tools, models, base_dir=os.path.dirname(os.path.abspath(path)),
                    chain=(os.path.realpath(path),))


def _sorted(problems: list[DagProblem], file: str) -> list[DagProblem]:
    """The document's own problems by line, then those of its sub-DAG files as they
    came (each file's sorted already), without repeats (a file used twice)."""
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: (0, p.line == 0, p.line) if p.file == file
                  else (1, False, 0))


def _in_scope(problem: DagProblem, nid: str) -> DagProblem:
    """A problem of an inline sub-DAG, as a problem of the parent's node ``nid``."""
    if problem.node is not None:
        return replace(problem, node=f"{nid}/{problem.node}")
    return replace(problem, node=nid, field=f"dag.{problem.field}" if problem.field else "dag")


def _load_subdag(
    ctx: _Context, file: str, nid: str, value: Any, line: int
) -> tuple[Dag | None, list[DagProblem]]:
    """The sub-DAG of node ``nid`` of ``file`` (its ``dag:`` at ``line``)."""

    def refuse(message: str, hint: str | None = None,
               code: str = "bad-subdag") -> tuple[Dag | None, list[DagProblem]]:
        return None, [DagProblem(message, file, line, nid, "dag", hint, code)]

    depth = ctx.depth + 1
    if depth > MAX_SUBDAG_DEPTH:
        return refuse(f"sub-DAGs are nested more than {MAX_SUBDAG_DEPTH} levels deep",
                      "run fewer levels of sub-DAGs: put the nodes of the innermost "
                      "sub-DAG in the DAG that runs it")
    if ctx.loaded[0] > MAX_DAG_NODES:
        return refuse(f"with its sub-DAGs the DAG has more than {MAX_DAG_NODES} nodes",
                      code="too-large")
    if isinstance(value, Mapping):
        dag, problems = _load_tree(value, file, replace(ctx, depth=depth), [])
        if dag is not None:
            ctx.loaded[0] += len(dag.nodes)
        return dag, [_in_scope(p, nid) for p in problems]
    if ctx.base_dir is None:
        return refuse(
            f"dag: {value} names a file, but a sub-DAG file is read only when the DAG is "
            "loaded from a file; inline the sub-DAG (`dag:` as a mapping) — `ax` and the "
            "Python client inline sub-DAG files when they submit a DAG file",
            "submit the DAG file with `ax run --remote` or the Python client, or replace "
            "the path with the sub-DAG's document")
    if "\0" in value:
        return refuse("dag: the path holds a NUL character")
    looked = os.path.normpath(os.path.join(ctx.base_dir, value))
    real = os.path.realpath(looked)
    if real in ctx.chain:
        names = " -> ".join(ctx.shown(p) for p in (*ctx.chain, real))
        return refuse(f"recursive sub-DAG: {names}",
                      "a sub-DAG cannot run itself, directly or through other sub-DAGs")
    if not os.path.exists(looked):
        return refuse(f"sub-DAG file {value} does not exist (looked for {looked})",
                      "the path is relative to the directory of the file that names it")
    if not os.path.isfile(looked):
        # A FIFO would block the loader forever, a device feed it without end.
        return refuse(f"sub-DAG file {value} is not a regular file (looked for {looked})")
    child_file = os.path.normpath(os.path.join(os.path.dirname(file), value))
    text, problems, unreadable = _read(looked, child_file)
    if unreadable is not None:
        return refuse(f"sub-DAG file {value} cannot be read: {unreadable} (looked for "
                      f"{looked})")
    if text is None:
        return None, problems
    child = replace(ctx, base_dir=os.path.dirname(looked), chain=(*ctx.chain, real),
                    depth=depth)
    dag, problems = _load_text(text, child_file, child)
    if dag is not None:
        ctx.loaded[0] += len(dag.nodes)
    return dag, problems


@_collector_paused()
def _load_tree(
    tree: Any, file: str, ctx: _Context, problems: list[DagProblem],
) -> tuple[Dag | None, list[DagProblem]]:
    builder = DagBuilder(file, functools.partial(_load_subdag, ctx, file))
    dag = builder.document(tree)
    problems = problems + builder.problems
    if dag is not None and dag.nodes:
        problems += check_dag(
            dag.nodes, file=file, sites=builder.sites, field_lines=builder.field_lines,
            tools=ctx.names("tool"), models=ctx.names("model"),
        )
        if len(dag.nodes) > MAX_DAG_NODES:
            problems.append(DagProblem(
                f"with its sub-DAGs the DAG has {len(dag.nodes)} nodes; at most "
                f"{MAX_DAG_NODES}", file, _line_of(tree), field="nodes", code="too-large"))
    if problems or dag is None:
        return None, _sorted(problems, file)
    return dag, []


def _line_of(tree: Any) -> int:
    return tree.line if isinstance(tree, LineMap) else 0


@_collector_paused()
def _load_text(
    text: str, file: str, ctx: _Context
) -> tuple[Dag | None, list[DagProblem]]:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_DOCUMENT_BYTES:
        return None, [DagProblem(f"document is {size} bytes; at most {MAX_DOCUMENT_BYTES}",
                                 file, 0, code="too-large")]
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        # A lone surrogate ("\ud800" in a JSON string): the YAML parser cannot read it.
        line = text.count("\n", 0, exc.start) + 1
        column = exc.start - text.rfind("\n", 0, exc.start)
        return None, [DagProblem(
            f"column {column}: a lone surrogate ({text[exc.start]!r}) is not Unicode text",
            file, line, code="yaml-syntax")]
    reader = _TreeBuilder(text, file)
    try:
        tree = reader.parse()
    except _Abort as exc:
        return None, _sorted([*reader.problems, exc.problem], file)
    return _load_tree(tree, file, ctx, reader.problems)


def _read(path: str, file: str) -> tuple[str | None, list[DagProblem], str | None]:
    """The text of DAG file ``path`` (named ``file`` in problems), or the problems; the
    third item is why the file could not be opened or read (None when it could)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        return None, [], str(exc.strerror or exc)
    if len(data) > MAX_DOCUMENT_BYTES:
        return None, [DagProblem(f"file is larger than {MAX_DOCUMENT_BYTES} bytes", file,
                                 code="too-large")], None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        return None, [DagProblem("file is not UTF-8 text", file, line,
                                 code="yaml-syntax")], None
    return text, [], None


def _load_path(
    path: str | os.PathLike[str], tools: Collection[str] | None, models: Collection[str] | None
) -> tuple[Dag | None, list[DagProblem]]:
    file = os.fspath(path)
    text, problems, unreadable = _read(file, file)
    if unreadable is not None:
        return None, [DagProblem(f"cannot read the file: {unreadable}", file,
                                 code="unreadable")]
    if text is None:
        return None, problems
    return _load_text(text, file, _file_context(file, tools, models))


def load_dag(
    path: str | os.PathLike[str], *,
    tools: Collection[str] | None = None, models: Collection[str] | None = None,
) -> Dag:
    """Load and validate a DAG file.

    A ``dag`` node's ``dag: <path>`` is read relative to the directory of the file that
    names it; its problems are reported with that file and its lines.

    Args:
        path: The YAML file.
        tools: Tool names a ``tool_call`` may use (default: the executor registry).
        models: Model names an ``llm_call`` may use (default: the executor registry).

    Returns:
        The validated DAG.

    Raises:
        DagError: The file cannot be read or the DAG is invalid; ``problems`` lists
            every problem found, sorted by line.
    """
    dag, problems = _load_path(path, tools, models)
    if dag is None:
        raise DagError(problems)
    return dag


def load_dag_text(
    text: str, *, file: str = "<string>",
    tools: Collection[str] | None = None, models: Collection[str] | None = None,
) -> Dag:
    """Load and validate a DAG from YAML text; see :func:`load_dag`.

    No file is read: a ``dag`` node whose ``dag:`` is a path is refused (``bad-subdag``);
    its sub-DAG must be inline (``dag:`` as a mapping). ``file`` only names the text.

    Args:
        text: The YAML document.
        file: Name used in problems.
        tools: Tool names a ``tool_call`` may use (default: the executor registry).
        models: Model names an ``llm_call`` may use (default: the executor registry).

    Raises:
        DagError: The DAG is invalid.
    """
    dag, problems = _load_text(text, file, _Context(tools, models))
    if dag is None:
        raise DagError(problems)
    return dag


def load_dag_mapping(
    data: Mapping[str, Any], *, file: str = "<inline>",
    tools: Collection[str] | None = None, models: Collection[str] | None = None,
) -> Dag:
    """Validate a DAG given as an already-parsed mapping (the REST API's inline JSON).

    Problems carry no line numbers (line 0); the node and field still locate them.
    No file is read: sub-DAGs must be inline (``dag:`` as a mapping, as in
    :meth:`Dag.canonical`); a path is refused (``bad-subdag``).

    Raises:
        DagError: The DAG is invalid.
    """
    too_large = _measure(data, file)
    if too_large is not None:
        raise DagError([too_large])
    dag, problems = _load_tree(data, file, _Context(tools, models), [])
    if dag is None:
        raise DagError(problems)
    return dag


def validate_file(
    path: str | os.PathLike[str], *,
    tools: Collection[str] | None = None, models: Collection[str] | None = None,
) -> list[DagProblem]:
    """Every problem of a DAG file, sorted by line; empty when it is valid.

    Never raises for a problem of the file (unreadable, not YAML, invalid DAG).
    """
    return _load_path(path, tools, models)[1]
