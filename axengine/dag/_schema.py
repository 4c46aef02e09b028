"""Field-level schema of the DAG language: document and node fields → :class:`Node`.

:class:`DagBuilder` reads a document tree (from YAML, with positions, or an inline
mapping without them), checks every field (types, ranges, unknown fields with "did you
mean", required fields per node type), applies the defaults of the model, records where
each template and field was written, and builds the nodes. It collects problems and
never stops at the first; whole-graph checks are :mod:`axengine.dag._validate`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from axengine.dag._input_schema import schema_problems
from axengine.dag._model import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    ITEM_FAILURE_POLICIES,
    MAX_MAP_ITEMS_LIMIT,
    NODE_TYPES,
    Dag,
    Edge,
    Fallback,
    Node,
)
from axengine.dag._resources import RESOURCE_NAMES, RESOURCE_SECTIONS, RUNNERS, parse_quantity
from axengine.dag._validate import SiteKind, TemplateSite, did_you_mean, has_template
from axengine.errors import DagProblem, InputError
from axengine.limits import finite_number, short_repr
from axengine.timeouts import FixedPolicy, node_timeout_policy

__all__ = ["MAX_DAG_NODES", "DagBuilder", "LineList", "LineMap", "Pos", "SubdagLoader"]

#: Most nodes a DAG may have. A submit writes every node in one store transaction and a
#: failure can skip a whole branch in one, so a transaction of an N-node DAG may hold
#: ~2N operations (``axengine.engine.txn_ops_bound``); 10,000 nodes (the bench's largest
#: chain) is ~20,000 ops — what a well-configured etcd takes (the store refuses larger
#: DAGs from its own ``max_txn_ops``; SQLite has no such limit) and what one transition
#: can plan in well under a second. 20,000 took the API 32 s to refuse.
MAX_DAG_NODES = 10_000

_NODE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_DAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}\Z")

_DOC_FIELDS = ("name", "description", "deadline", "input_schema", "output", "nodes")
_COMMON_FIELDS = (
    "type", "description", "input", "timeout", "retry", "next", "on_failure",
    "stall_timeout", "queue_timeout", "lane",
)
#: Fields of the node types that run on an executor (the others run on the API server).
_EXECUTOR_FIELDS = ("runner", "resources", "timeout_policy", "stall_windows")
#: Fields of a map node (``tool_call`` and ``llm_call`` only); all but ``map`` need it.
_MAP_FIELDS = ("map", "max_concurrency", "max_items", "on_item_failure")
_TYPE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "tool_call": ("tool", "simulate", *_EXECUTOR_FIELDS, *_MAP_FIELDS),
    "llm_call": ("model", "prompt", "temperature", "max_tokens", "fallback", "simulate",
                 *_EXECUTOR_FIELDS, *_MAP_FIELDS),
    "condition": ("expression",),
    "human_gateway": ("on_timeout", "four_eyes"),
    "dag": ("dag",),
}
#: Every field of a ``dag`` node: it runs no handler of its own (its DAG's nodes do).
_DAG_NODE_FIELDS = ("type", "description", "input", "next", "on_failure", "dag")
_DAG_HINT = ("name the sub-DAG's file, e.g. `dag: flows/approval.yaml` (relative to this "
             "file), or write the DAG document inline as a mapping")
_REQUIRED: Mapping[str, tuple[str, ...]] = {
    "tool_call": ("tool",),
    "llm_call": ("model", "prompt"),
    "condition": ("expression",),
    "human_gateway": (),
    "dag": ("dag",),
}
#: Per node type: the fields it has, the fields checked as known (its own and the executor
#: fields, which get their own message), and the other types' fields (for the hint).
_ALLOWED: Mapping[str, tuple[str, ...]] = {
    t: (*_COMMON_FIELDS, *names) for t, names in _TYPE_FIELDS.items()
}
_KNOWN: Mapping[str, tuple[str, ...]] = {
    t: tuple(dict.fromkeys((*_ALLOWED[t], *_EXECUTOR_FIELDS))) for t in _ALLOWED
}
_OTHERS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    t: {o: f for o, f in _TYPE_FIELDS.items() if o != t} for t in _TYPE_FIELDS
}
_EDGE_FIELDS = ("target", "condition", "when", "max_visits")
#: Most visits a loop's back edge may allow (``max_visits``).
MAX_LOOP_VISITS = 100
#: Most items of a map that may run at once (``max_concurrency``).
MAX_MAP_CONCURRENCY = 1_000
_MAP_HINT = 'map: "{{ .nodes.split.output.sections }}"'
_MISSING_HINT: Mapping[str, str] = {
    "tool": "name the tool, e.g. `tool: pdf_parser`",
    "model": "name the model, e.g. `model: gpt-4o-mini`",
    "prompt": "add `prompt:` with the prompt template",
    "expression": "add `expression:` (an if/elif/else form or one template)",
}
_EXECUTES = ("tool_call", "llm_call")
_RESOURCES_HINT = ("resources: {requests: {cpu: 500m, memory: 256Mi}, "
                   "limits: {cpu: '1', memory: 1Gi}}")
_QUANTITY_HINT: Mapping[str, str] = {
    "cpu": "a non-negative number of cores, e.g. 500m (half a core), 1, 2",
    "memory": "a non-negative number of bytes with a suffix, e.g. 256Mi, 1Gi, 500M",
}
_NEXT_HINT = "next is a node id, a list of ids, or a list of {target, condition} / {target, when}"

Pos = tuple[int, bool]  # (1-based line of a value's first content line, exact?)
#: Loads the DAG a ``dag`` node names: ``(node id, the dag: value (a file path or an
#: inline document), line of dag:)`` → the DAG (None when it has problems) and the
#: problems, already located (the loader resolves files and bounds nesting).
SubdagLoader = Callable[[str, Any, int], tuple[Dag | None, list[DagProblem]]]


class LineMap(dict[str, Any]):
    """A mapping read from YAML, with the line of each key and the position of each value."""

    __slots__ = ("key_lines", "line", "value_pos")

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[str, int] = {}
        self.value_pos: dict[str, Pos] = {}


class LineList(list[Any]):
    """A list read from YAML, with the position of each item."""

    __slots__ = ("item_pos", "line")

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.item_pos: list[Pos] = []


def _line(value: Any) -> int:
    return value.line if isinstance(value, LineMap | LineList) else 0


def _top_line(tree: Mapping[str, Any]) -> int:
    """Line for problems about the whole document: its first line when unknown."""
    return _line(tree) or 1


def _key_line(mapping: Mapping[str, Any], key: str) -> int:
    return mapping.key_lines.get(key, mapping.line) if isinstance(mapping, LineMap) else 0


def _value_pos(mapping: Mapping[str, Any], key: str) -> Pos:
    return mapping.value_pos.get(key, (0, False)) if isinstance(mapping, LineMap) else (0, False)


def _item_pos(seq: Sequence[Any], index: int) -> Pos:
    return seq.item_pos[index] if isinstance(seq, LineList) else (0, False)


def _plain(value: Any) -> Any:
    """Deep copy without the line annotations (what the stored DAG keeps)."""
    if isinstance(value, str):  # most values: and no ABC check for them
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _kind(value: Any) -> str:
    """What a value is, in the document's words (for messages)."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    for types, word in ((Mapping, "a mapping"), (list, "a list"), (str, "a string"),
                        (int | float, "a number")):
        if isinstance(value, types):
            return word
    return f"a {type(value).__name__}"


class DagBuilder:
    """Checks the document and node fields and builds the nodes, collecting problems."""

    def __init__(self, file: str, subdags: SubdagLoader | None = None) -> None:
        self.file = file
        self.subdags = subdags
        self.problems: list[DagProblem] = []
        self.sites: list[TemplateSite] = []
        self.field_lines: dict[tuple[str, str], int] = {}

    def problem(
        self, code: str, message: str, line: int, node: str | None = None,
        field: str | None = None, hint: str | None = None,
    ) -> None:
        self.problems.append(DagProblem(message, self.file, line, node, field, hint, code))

    # -- value helpers: report and return None when the value is not acceptable --------

    def _string(
        self, raw: Mapping[str, Any], key: str, nid: str | None, prefix: str = ""
    ) -> str | None:
        value = raw.get(key)
        if value is None or isinstance(value, str):
            return value
        self.problem("bad-value", f"{prefix}{key} must be a string, not "
                     f"{_kind(value)}", _key_line(raw, key), nid, prefix + key,
                     "quote the value")
        return None

    def _number(
        self, raw: Mapping[str, Any], key: str, nid: str | None, *,
        low: float = 0.0, high: float | None = None, low_inclusive: bool = False,
        prefix: str = "",
    ) -> float | None:
        value = raw.get(key)
        if value is None:
            return None
        number = finite_number(value)  # (an integer past a float's range is not one)
        ok = number is not None and (number >= low if low_inclusive else number > low) \
            and (high is None or number <= high)
        if ok:
            return number
        bounds = f"{'>=' if low_inclusive else '>'} {low:g}"
        if high is not None:
            bounds = f"between {low:g} and {high:g}"
        self.problem("bad-value", f"{prefix}{key} must be a number {bounds}, not "
                     f"{short_repr(value)}", _key_line(raw, key), nid, prefix + key)
        return None

    def _integer(
        self, raw: Mapping[str, Any], key: str, nid: str, *, low: int, high: int,
        prefix: str = "",
    ) -> int | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        self.problem("bad-value", f"{prefix}{key} must be an integer from {low} to {high}, "
                     f"not {short_repr(value)}", _key_line(raw, key), nid, prefix + key)
        return None

    def _choice(
        self, raw: Mapping[str, Any], key: str, nid: str, choices: tuple[str, ...]
    ) -> str | None:
        value = raw.get(key)
        if value is None or value in choices:
            return value
        self.problem("bad-value", f"{key} must be one of {', '.join(choices)}, not {value!r}",
                     _key_line(raw, key), nid, key, did_you_mean(str(value), choices))
        return None

    def _fields(
        self, raw: Mapping[str, Any], allowed: Collection[str], nid: str | None,
        prefix: str = "", other: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        for key in raw:
            if key in allowed:
                continue
            owners = [t for t, names in (other or {}).items() if key in names]
            hint = (
                f"`{key}` is a field of {' and '.join(owners)} nodes" if owners
                else did_you_mean(str(key), allowed)
            )
            self.problem("unknown-field", f"unknown field {prefix}{key!r}",
                         _key_line(raw, key), nid, f"{prefix}{key}",
                         hint or f"valid fields: {', '.join(allowed)}")

    def _site(
        self, nid: str, field: str, source: str, pos: Pos, kind: SiteKind = "template"
    ) -> None:
        self.sites.append(TemplateSite(nid, field, source, pos[0], pos[1], kind))

    def _collect_input(self, nid: str, field: str, value: Any, pos: Pos) -> None:
        if isinstance(value, str):
            if has_template(value):
                self._site(nid, field, value, pos)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                self._collect_input(nid, f"{field}.{key}", item, _value_pos(value, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._collect_input(nid, f"{field}[{i}]", item, _item_pos(value, i))

    # -- document -----------------------------------------------------------------------

    def document(self, tree: Any) -> Dag | None:
        if not isinstance(tree, Mapping):
            kind = _kind(tree)
            self.problem("not-a-mapping", f"the document is {kind}, not a mapping",
                         _line(tree) or 1, hint="a DAG document has `name:` and `nodes:`")
            return None
        self._fields(tree, _DOC_FIELDS, None)
        name = self._string(tree, "name", None)
        if "name" not in tree:
            self.problem("missing-field", "missing `name`", _top_line(tree), field="name",
                         hint="add `name: my_dag` (letters, digits, _ . -)")
        elif tree["name"] is None:
            self.problem("bad-value", "`name` is empty", _key_line(tree, "name"),
                         field="name", hint="give it a value: `name: my_dag` (letters, "
                         "digits, _ . -)")
        elif name is not None and not _DAG_NAME.match(name):
            self.problem("bad-value", f"name {name!r} is not a valid DAG name",
                         _key_line(tree, "name"), field="name",
                         hint="start with a letter or _, then letters, digits, _ . - "
                         "(at most 128)")
        description = self._string(tree, "description", None)
        deadline = self._number(tree, "deadline", None)
        output = self._string(tree, "output", None)
        if output is not None:
            # Read in this DAG's scope when it runs as a sub-DAG: any of its nodes.
            self._site("", "output", output, _value_pos(tree, "output"))
        input_schema = self._input_schema(tree)
        raw_nodes = tree.get("nodes")
        nodes: dict[str, Node] = {}
        if "nodes" not in tree:
            self.problem("missing-field", "missing `nodes`", _top_line(tree), field="nodes",
                         hint="add `nodes:` with at least one node")
        elif not isinstance(raw_nodes, Mapping):
            self.problem("not-a-mapping", "`nodes` must be a mapping of node id to node",
                         _key_line(tree, "nodes"), field="nodes")
        elif not raw_nodes:
            self.problem("bad-value", "`nodes` is empty", _key_line(tree, "nodes"),
                         field="nodes", hint="a DAG needs at least one node")
        elif len(raw_nodes) > MAX_DAG_NODES:
            self.problem("too-large", f"{len(raw_nodes)} nodes; at most {MAX_DAG_NODES}",
                         _key_line(tree, "nodes"), field="nodes")
        else:
            for nid, raw in raw_nodes.items():
                line = _key_line(raw_nodes, nid)
                if not isinstance(nid, str) or not _NODE_ID.match(nid):
                    self.problem(
                        "bad-node-id", f"node id {nid!r} is not an identifier", line,
                        field="nodes", hint="start with a letter or _, then letters, digits or _ "
                        "(at most 128): templates read it as nodes.<id>.output",
                    )
                    nid = str(nid)
                nodes[nid] = self.node(nid, raw, line)
        return Dag(name=name or "", nodes=nodes, description=description, deadline=deadline,
                   input_schema=input_schema, output=output, source=self.file)

    def _input_schema(self, tree: Mapping[str, Any]) -> dict[str, Any] | None:
        """``input_schema:`` as plain data, or None (unset, or reported as a problem)."""
        if "input_schema" not in tree:
            return None
        raw = tree["input_schema"]
        found = schema_problems(raw)
        for path, message in found:
            # The line of the deepest key of the path that the document marks.
            line, value = _key_line(tree, "input_schema"), raw
            for part in path:
                if isinstance(value, LineMap) and part in value:
                    line, value = _key_line(value, part), value[part]
                elif isinstance(value, LineList) and isinstance(part, int) \
                        and part < len(value):
                    line, value = _item_pos(value, part)[0] or line, value[part]
                else:
                    break
            self.problem("bad-schema", message, line, field="input_schema",
                         hint="input_schema is a JSON Schema (draft 2020-12 unless `$schema` "
                         "says otherwise), e.g. {type: object, required: [pdf_url], "
                         "properties: {pdf_url: {type: string}}}")
        return None if found else _plain(raw)

    # -- nodes --------------------------------------------------------------------------

    def node(self, nid: str, raw: Any, line: int) -> Node:
        if not isinstance(raw, Mapping):
            self.problem("not-a-mapping", f"node must be a mapping with `type:`, not "
                         f"{_kind(raw)}", line, nid)
            return Node(id=nid, type="", line=line)
        key_lines = raw.key_lines if isinstance(raw, LineMap) else {}
        default_line = _line(raw)
        for key in raw:
            self.field_lines[(nid, str(key))] = key_lines.get(key, default_line)
        raw_type = raw.get("type")
        ntype = raw_type if isinstance(raw_type, str) and raw_type in NODE_TYPES else ""
        if "type" not in raw:
            self.problem("missing-field", "missing `type`", line, nid, "type",
                         f"type is one of: {', '.join(NODE_TYPES)}")
        elif not ntype:
            close = did_you_mean(str(raw_type), NODE_TYPES)
            self.problem("unknown-node-type", f"unknown node type {raw_type!r}",
                         _key_line(raw, "type"), nid, "type",
                         f"{close + ' ' if close else ''}types: {', '.join(NODE_TYPES)}")
        if ntype == "dag":
            return self._dag_node(nid, raw, line)
        if ntype:
            allowed = _ALLOWED[ntype]
            self._fields(raw, _KNOWN[ntype], nid, other=_OTHERS[ntype])
            for key in _EXECUTOR_FIELDS:
                if key in raw and key not in allowed:
                    self.problem(
                        "unknown-field", f"{ntype} nodes do not run on an executor (the API "
                        f"server decides them), so `{key}` does not apply",
                        _key_line(raw, key), nid, key,
                        f"remove `{key}`; it is a field of tool_call and llm_call nodes")
            for req in _REQUIRED[ntype]:
                if raw.get(req) is None:  # absent, or `tool:` with nothing after it
                    where = line if req not in raw else _key_line(raw, req)
                    self.problem("missing-field", f"{ntype} node needs `{req}`", where, nid,
                                 req, _MISSING_HINT[req])
        else:
            every = {f for names in _TYPE_FIELDS.values() for f in names}
            self._fields(raw, (*_COMMON_FIELDS, *sorted(every)), nid)
        return self._node_values(nid, ntype, raw, line)

    def _dag_node(self, nid: str, raw: Mapping[str, Any], line: int) -> Node:
        """A ``dag`` node: the fields of a node that runs no handler of its own, and the
        DAG it runs (loaded by :attr:`subdags`)."""
        others = {t: f for t, f in _TYPE_FIELDS.items() if t != "dag"}
        for key in raw:
            if key in _DAG_NODE_FIELDS:
                continue
            if key in _COMMON_FIELDS or key in _EXECUTOR_FIELDS:
                self.problem(
                    "unknown-field", f"a dag node runs no handler of its own, so `{key}` "
                    "does not apply", _key_line(raw, key), nid, str(key),
                    f"set `{key}` on the nodes of its DAG")
                continue
            owners = [t for t, names in others.items() if key in names]
            close = did_you_mean(str(key), _DAG_NODE_FIELDS)
            hint = (f"`{key}` is a field of {' and '.join(owners)} nodes; " if owners
                    else f"{close} " if close else "")
            self.problem("unknown-field", f"unknown field {key!r}", _key_line(raw, key),
                         nid, str(key),
                         f"{hint}a dag node has the fields {', '.join(_DAG_NODE_FIELDS)}")
        if "dag" not in raw:
            self.problem("missing-field", "dag node needs `dag`", line, nid, "dag", _DAG_HINT)
        if "input" in raw:
            self._collect_input(nid, "input", raw["input"], _value_pos(raw, "input"))
        subdag, subdag_file = self._subdag(nid, raw)
        return Node(
            id=nid,
            type="dag",
            description=self._string(raw, "description", nid),
            input=_plain(raw.get("input")),
            next=self._edges(nid, raw),
            on_failure=self._string(raw, "on_failure", nid),
            subdag=subdag,
            subdag_file=subdag_file,
            line=line,
        )

    def _subdag(self, nid: str, raw: Mapping[str, Any]) -> tuple[Dag | None, str | None]:
        """The DAG of ``dag:`` (a file path or an inline document) and the path as
        written (None inline); (None, ...) when it has problems (reported)."""
        if "dag" not in raw:
            return None, None
        value = raw["dag"]
        line = _key_line(raw, "dag")
        if (isinstance(value, str) and not value.strip()) or \
                not isinstance(value, str | Mapping):
            what = "an empty string" if isinstance(value, str) else _kind(value)
            self.problem("bad-value", f"dag must be a file path or a DAG document (a "
                         f"mapping), not {what}", line, nid, "dag", _DAG_HINT)
            return None, None
        file = value if isinstance(value, str) else None
        if self.subdags is None:
            self.problem("bad-subdag", "sub-DAGs cannot be loaded here", line, nid, "dag")
            return None, file
        subdag, problems = self.subdags(nid, value, line)
        self.problems.extend(problems)
        return subdag, file

    def _node_values(self, nid: str, ntype: str, raw: Mapping[str, Any], line: int) -> Node:
        timeout = self._number(raw, "timeout", nid)
        if timeout is None:
            timeout = DEFAULT_TIMEOUT.get(ntype, 300.0)
        retry = self._integer(raw, "retry", nid, low=0, high=100)
        stall = self._number(raw, "stall_timeout", nid)
        if stall is not None and stall > timeout:
            self.problem("bad-value", f"stall_timeout {stall:g} is longer than timeout "
                         f"{timeout:g}, so it could never fire", _key_line(raw, "stall_timeout"),
                         nid, "stall_timeout", "make stall_timeout smaller than timeout")
        if "input" in raw:
            self._collect_input(nid, "input", raw["input"], _value_pos(raw, "input"))
        prompt = self._string(raw, "prompt", nid)
        if prompt is not None:
            self._site(nid, "prompt", prompt, _value_pos(raw, "prompt"), "prompt")
        expression = self._string(raw, "expression", nid)
        if expression is not None and ntype == "condition":
            self._site(nid, "expression", expression, _value_pos(raw, "expression"),
                       "expression")
        description = self._string(raw, "description", nid)
        if description is not None and ntype == "human_gateway":
            # The engine renders a gate's description: approvers see the live values.
            self._site(nid, "description", description, _value_pos(raw, "description"),
                       "prompt")
        on_timeout = self._choice(raw, "on_timeout", nid, ("approve", "reject"))
        four_eyes = raw.get("four_eyes", False)
        if not isinstance(four_eyes, bool):
            self.problem("bad-value", f"four_eyes must be true or false, not {_kind(four_eyes)}",
                         _key_line(raw, "four_eyes"), nid, "four_eyes",
                         "write `four_eyes: true` to refuse a decision by the task's submitter")
            four_eyes = False
        simulate = raw.get("simulate")
        if simulate is not None and not isinstance(simulate, Mapping):
            self.problem("bad-value", "simulate must be a mapping", _key_line(raw, "simulate"),
                         nid, "simulate")
            simulate = None
        max_tokens = self._integer(raw, "max_tokens", nid, low=1, high=10_000_000)
        runner = self._choice(raw, "runner", nid, RUNNERS) if ntype in _EXECUTES else None
        mapped: dict[str, Any] = self._map(nid, raw) if ntype in _EXECUTES else {}
        return Node(
            id=nid,
            type=ntype,
            description=description,
            input=_plain(raw.get("input")),
            timeout=timeout,
            retry=DEFAULT_RETRY.get(ntype, 0) if retry is None else retry,
            next=self._edges(nid, raw),
            tool=self._string(raw, "tool", nid),
            model=self._string(raw, "model", nid),
            prompt=prompt,
            temperature=self._number(raw, "temperature", nid, high=2.0, low_inclusive=True),
            max_tokens=max_tokens,
            fallback=self._fallback(nid, raw),
            expression=expression,
            on_failure=self._string(raw, "on_failure", nid),
            on_timeout=(on_timeout or "reject") if ntype == "human_gateway" else on_timeout,
            stall_timeout=stall,
            stall_windows=(self._stall_windows(nid, raw, timeout)
                           if ntype in _EXECUTES else None),
            queue_timeout=self._number(raw, "queue_timeout", nid),
            lane=self._choice(raw, "lane", nid, ("default", "fast")) or "default",
            simulate=_plain(simulate),
            four_eyes=four_eyes,
            runner=runner,
            resources=self._resources(nid, raw) if ntype in _EXECUTES else None,
            timeout_policy=(self._timeout_policy(nid, raw, timeout)
                            if ntype in _EXECUTES else None),
            **mapped,
            line=line,
        )

    def _map(self, nid: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """``map:`` and the fields that shape a map (``max_concurrency``, ``max_items``,
        ``on_item_failure``), as :class:`Node` keywords; the others need ``map:``."""
        out: dict[str, Any] = {}
        source = self._string(raw, "map", nid)
        if source is not None:
            if "{{" in source:
                self._site(nid, "map", source, _value_pos(raw, "map"))
                out["map"] = source
            else:
                self.problem("bad-value", "map must be a template that renders a list, e.g. "
                             + _MAP_HINT, _key_line(raw, "map"), nid, "map",
                             "quote the template; the node runs once per item of the list")
        out["max_concurrency"] = self._integer(raw, "max_concurrency", nid, low=1,
                                               high=MAX_MAP_CONCURRENCY)
        out["max_items"] = self._integer(raw, "max_items", nid, low=1,
                                         high=MAX_MAP_ITEMS_LIMIT)
        out["on_item_failure"] = self._choice(raw, "on_item_failure", nid,
                                              ITEM_FAILURE_POLICIES) or "fail"
        if "map" not in raw:
            for key in _MAP_FIELDS[1:]:
                if key in raw:
                    self.problem("missing-field", f"{key} applies to a map node; add `map:`",
                                 _key_line(raw, key), nid, key,
                                 f"add {_MAP_HINT} to run the node once per item, or "
                                 f"remove `{key}`")
        return out

    def _stall_windows(self, nid: str, raw: Mapping[str, Any],
                       timeout: float) -> dict[str, float] | None:
        """``stall_windows:`` — step name or glob → seconds, each positive and at most
        the node's ``timeout`` (a longer window could never fire)."""
        value = raw.get("stall_windows")
        if value is None:
            return None
        hint = 'e.g. {"vendor:*": 600, "llm:*": 120}'
        if not isinstance(value, Mapping) or not value:
            what = "empty" if isinstance(value, Mapping) else _kind(value)
            self.problem("bad-value", f"stall_windows must be a mapping of step names or "
                         f"globs to seconds, not {what}", _key_line(raw, "stall_windows"),
                         nid, "stall_windows", hint)
            return None
        out: dict[str, float] = {}
        for key in value:
            field = f"stall_windows.{key}"
            if not isinstance(key, str) or not key.strip():
                self.problem("bad-value", f"stall_windows keys must be non-empty step names "
                             f"or globs, not {key!r}", _key_line(value, key)
                             if isinstance(key, str) else _key_line(raw, "stall_windows"),
                             nid, "stall_windows", hint)
                continue
            seconds = self._number(value, key, nid, prefix="stall_windows.")
            if seconds is None:
                continue
            if seconds > timeout:
                self.problem("bad-value", f"{field} {seconds:g} is longer than timeout "
                             f"{timeout:g}, so it could never fire", _key_line(value, key),
                             nid, field, f"make it at most {timeout:g} or raise timeout")
                continue
            out[key] = seconds
        return out

    def _timeout_policy(self, nid: str, raw: Mapping[str, Any],
                        timeout: float) -> dict[str, Any] | None:
        """``timeout_policy:`` checked as :mod:`axengine.timeouts` reads it, with the
        node's ``timeout`` as its ``max`` and ``fallback`` unless it names them; the
        stored form is the mapping as written (the engine builds the policy again)."""
        value = raw.get("timeout_policy")
        if value is None:
            return None
        line = _key_line(raw, "timeout_policy")
        if not isinstance(value, Mapping):
            self.problem("bad-value", f"timeout_policy must be a mapping, not {_kind(value)}",
                         line, nid, "timeout_policy", "e.g. {kind: adaptive, percentile: 99}")
            return None
        policy = _plain(dict(value))
        try:
            built = node_timeout_policy(policy, timeout, source="timeout_policy")
        except InputError as exc:
            self.problem("bad-value", str(exc), line, nid, "timeout_policy",
                         "see docs/dag-language.md#adaptive-timeouts")
            return None
        if isinstance(built, FixedPolicy):
            self.problem("bad-value", "a fixed timeout_policy is just `timeout`", line, nid,
                         "timeout_policy", "use kind percentile or adaptive, or `timeout`")
            return None
        return policy  # type: ignore[no-any-return]

    def _resources(self, nid: str, raw: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
        """``resources:`` as plain quantity strings, with only the sections set."""
        value = raw.get("resources")
        if value is None:
            return None
        if not isinstance(value, Mapping):
            self.problem("bad-value", f"resources must be a mapping, not {_kind(value)}",
                         _key_line(raw, "resources"), nid, "resources", _RESOURCES_HINT)
            return None
        self._fields(value, RESOURCE_SECTIONS, nid, "resources.")
        out: dict[str, dict[str, str]] = {}
        amounts: dict[tuple[str, str], Any] = {}
        for section in RESOURCE_SECTIONS:
            items = value.get(section)
            prefix = f"resources.{section}."
            if items is None:
                continue
            if not isinstance(items, Mapping):
                self.problem("bad-value", f"resources.{section} must be a mapping of cpu and "
                             f"memory, not {_kind(items)}", _key_line(value, section), nid,
                             f"resources.{section}", _RESOURCES_HINT)
                continue
            self._fields(items, RESOURCE_NAMES, nid, prefix)
            quantities: dict[str, str] = {}
            for name in RESOURCE_NAMES:
                if name in items:
                    text = self._quantity(items, name, nid, prefix)
                    if text is not None:
                        quantities[name] = text
                        amounts[(section, name)] = parse_quantity(text)
            if quantities:
                out[section] = quantities
        for name in RESOURCE_NAMES:
            request, limit = amounts.get(("requests", name)), amounts.get(("limits", name))
            if request is not None and limit is not None and request > limit:
                self.problem(
                    "bad-value", f"resources.requests.{name} {out['requests'][name]} is more "
                    f"than resources.limits.{name} {out['limits'][name]}",
                    _key_line(value["requests"], name), nid, f"resources.requests.{name}",
                    "a request may not exceed its limit (Kubernetes refuses such a pod)")
        return out or None

    def _quantity(self, raw: Mapping[str, Any], key: str, nid: str, prefix: str) -> str | None:
        """A quantity as its string (``500m``, ``256Mi``; a YAML number becomes its text)."""
        value = raw[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = str(value) if finite_number(value) is not None else value
        message = f"{prefix}{key} must be a Kubernetes quantity, not {_kind(value)}"
        if isinstance(text, str):
            try:
                parse_quantity(text)
            except ValueError as exc:
                message = f"{prefix}{key}: {exc}"
            else:
                return text
        self.problem("bad-value", message, _key_line(raw, key), nid, prefix + key,
                     _QUANTITY_HINT[key])
        return None

    def _fallback(self, nid: str, raw: Mapping[str, Any]) -> Fallback | None:
        value = raw.get("fallback")
        if value is None:
            return None
        if not isinstance(value, Mapping):
            self.problem("bad-value", "fallback must be a mapping {model, threshold}",
                         _key_line(raw, "fallback"), nid, "fallback")
            return None
        self._fields(value, ("model", "threshold"), nid, "fallback.")
        model = self._string(value, "model", nid, "fallback.")
        if model is None:
            self.problem("missing-field", "fallback needs `model`", _key_line(raw, "fallback"),
                         nid, "fallback.model", _MISSING_HINT["model"])
            return None
        self.field_lines[(nid, "fallback.model")] = _key_line(value, "model")
        threshold = self._number(value, "threshold", nid, high=1.0, low_inclusive=True,
                                 prefix="fallback.")
        return Fallback(model, 0.8 if threshold is None else threshold)

    def _edges(self, nid: str, raw: Mapping[str, Any]) -> tuple[Edge, ...]:
        value = raw.get("next")
        line, _ = _value_pos(raw, "next")
        if value is None:
            return ()
        if isinstance(value, str):
            return (Edge(value, line=line),)
        if not isinstance(value, list):
            self.problem("bad-value", f"next must not be {_kind(value)}",
                         _key_line(raw, "next"), nid, "next", _NEXT_HINT)
            return ()
        edges: list[Edge] = []
        seen: set[Edge] = set()  # (a list's `in` made a wide fan-out quadratic)
        for i, item in enumerate(value):
            edge = self._edge(nid, i, item, _item_pos(value, i)[0] or line)
            if edge is None:
                continue
            if edge in seen:
                self.problem("bad-edge", f"next[{i}] repeats an earlier edge to "
                             f"{edge.target!r}", edge.line, nid, f"next[{i}]",
                             "remove the duplicate")
                continue
            edges.append(edge)
            seen.add(edge)
        return tuple(edges)

    def _edge(self, nid: str, i: int, item: Any, line: int) -> Edge | None:
        field = f"next[{i}]"
        if isinstance(item, str):
            return Edge(item, line=line)
        if not isinstance(item, Mapping):
            self.problem("bad-value", f"{field} must be a node id or a mapping, not "
                         f"{_kind(item)}", line, nid, field, _NEXT_HINT)
            return None
        self._fields(item, _EDGE_FIELDS, nid, f"{field}.")
        target = item.get("target")
        if not isinstance(target, str):
            what = "missing `target`" if target is None else "target must be a node id"
            self.problem("missing-field" if target is None else "bad-value",
                         f"{field}: {what}", line, nid, f"{field}.target", _NEXT_HINT)
            return None
        condition = self._string(item, "condition", nid, f"{field}.")
        when = item.get("when")
        if when is not None and not isinstance(when, str):
            self.problem("bad-value", f"{field}.when must be a label (string), not {when!r}",
                         _key_line(item, "when"), nid, f"{field}.when", "quote the label")
            when = None
        if condition is not None and when is not None:
            self.problem("bad-edge", f"{field} has both `condition` and `when`", line, nid,
                         field, "use `when:` on condition nodes, `condition:` elsewhere")
        if condition is not None:
            self._site(nid, f"{field}.condition", condition, _value_pos(item, "condition"),
                       "guard")
        max_visits = self._integer(item, "max_visits", nid, low=1, high=MAX_LOOP_VISITS,
                                   prefix=f"{field}.")
        if "max_visits" in item and condition is None and when is None \
                and "condition" not in item and "when" not in item:
            self.problem("bad-edge", "a loop's back edge needs a guard (`condition:` or "
                         "`when:`) as well as max_visits", _key_line(item, "max_visits"),
                         nid, f"{field}.max_visits",
                         "add the condition on which the loop goes round again, e.g. "
                         "condition: \"{{ .output.verdict == 'revise' }}\"")
        if max_visits is None and "max_visits" in item:
            # Reported above; still a back edge, so that no cycle is reported besides.
            max_visits = MAX_LOOP_VISITS
        return Edge(target, condition, when, max_visits, line=line)

