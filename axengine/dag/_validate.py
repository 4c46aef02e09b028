"""Whole-DAG checks: edge targets, cycles, loops, reachability, templates, labels, names.

The schema (:mod:`axengine.dag._schema`) turns a document into :class:`Node` values and
reports field-level problems (types, ranges, unknown fields). Everything that needs the
whole graph or another module (the template sandbox, the tool and model registries) is
checked here, by :func:`check_dag`, which never stops at the first problem.

Cycles are looked for on forward edges only: the back edge of a bounded loop (an edge
with ``max_visits``) is checked apart (it must close a loop, entered at its first node
and left from its last). Names only some templates have (``item``/``index`` in a map
node, ``visit``/``previous`` in a loop's nodes) are reported by the template module as
undefined; the checks here keep those reports only where the name is not defined.

Graph algorithms are iterative and linear in nodes + edges (plus one bitset per node for
the ancestor check), so a 10,000-node DAG validates without recursion limits.

Only a DAG's own nodes are checked: the nodes of a ``dag`` node's sub-DAG (in
:attr:`Dag.nodes` as ``{dag node}/{child id}``) were checked as their own DAG when it
was loaded. A DAG's ``output`` (what its ``dag`` node outputs when it runs as a sub-DAG)
is a template site of node ``""``: it may read any node of the DAG.
"""

from __future__ import annotations

import difflib
import re
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from axengine import template
from axengine.dag._model import NODE_TYPES, SCOPE, Dag, Edge, Node
from axengine.errors import DagProblem, TemplateError, TemplateSecurityError

__all__ = [
    "MAX_REPORTED_CYCLES",
    "SiteKind",
    "TemplateSite",
    "check_dag",
    "did_you_mean",
    "find_cycles",
    "has_template",
]

#: At most this many cycles are reported for one DAG (each back edge closes one).
MAX_REPORTED_CYCLES = 20

SiteKind = Literal["template", "prompt", "guard", "expression"]
_TEMPLATE_HINT = ("templates are Jinja2 in {{ }}, e.g. \"{{ .input.x }}\"; quote the "
                  "whole value in YAML")
_SYNTAX_HINTS: dict[str, str] = {
    "template": _TEMPLATE_HINT,
    "prompt": _TEMPLATE_HINT,
    "guard": "a guard is one expression, e.g. \"{{ .output.status == 'success' }}\"",
    "expression": "write `if <expr>: <label>` / `elif <expr>: <label>` lines ending "
    "with `else: <label>`, or one template such as \"{{ .output.kind }}\"",
}
_UNSAFE_HINT = "remove the tag: templates read only input, nodes.<id>.output and task"
#: Names only some templates have: a map node's item, a loop's visit; the template
#: module reports them as undefined and the checks here decide where they are defined.
_SCOPED_NAMES: dict[str, str] = {
    f"{name!r} is not defined": name for name in ("item", "index", "visit", "previous")
}
#: ``previous.<id>`` / ``previous['<id>']`` in a (normalized) template.
_PREVIOUS = re.compile(
    r"(?<![\w.])previous\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(['\"])([A-Za-z_]\w*)\2\s*\])"
)
_MAP_EXAMPLE = 'map: "{{ .nodes.split.output.sections }}"'
_LOOP_HINT = ("a loop is closed by an edge from its last node back to its first with "
              "`max_visits:` and a guard (`condition:` or `when:`)")


@dataclass(frozen=True)
class TemplateSite:
    """One template of a node, with where it was written.

    Attributes:
        node: Node id.
        field: Field path, e.g. ``"prompt"``, ``"input.to"`` or ``"next[0].condition"``.
        source: The template as written (leading dots and all).
        line: 1-based file line of the template's first line (0 when unknown).
        exact: Whether line ``k`` of the template is file line ``line + k - 1``
            (single-line values and literal ``|`` blocks); folded scalars are not.
        kind: ``expression`` for a condition node's expression (the ``if/elif/else``
            form or one template), ``guard`` for an edge condition (a template, or a
            bare expression such as ``output.ok``), ``prompt`` for an ``llm_call``'s
            prompt and a gate's description (they also read ``node.input``),
            ``template`` for everything else (node inputs).
    """

    node: str
    field: str
    source: str
    line: int
    exact: bool = True
    kind: SiteKind = "template"


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A ``did you mean 'x'?`` hint for ``word`` among ``candidates``, if one is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def find_cycles(
    successors: Mapping[str, Sequence[str]], *, limit: int = MAX_REPORTED_CYCLES
) -> list[list[str]]:
    """Cycles closed by the back edges of a depth-first search, as node paths.

    Each path starts and ends with the same node (``[a, b, c, a]``; a self-loop is
    ``[a, a]``) and follows edges in order. Nodes are visited in mapping order and
    successors in sequence order, so the result is deterministic.

    Args:
        successors: Every node's successors; every successor must be a key.
        limit: Stop after this many cycles.

    Returns:
        Up to ``limit`` cycles; empty when the graph is acyclic.
    """
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(successors, white)
    cycles: list[list[str]] = []
    for root in successors:
        if colour[root] != white:
            continue
        # The DFS path and, for each entry, the index of the next successor to visit.
        path: list[str] = [root]
        index: list[int] = [0]
        position: dict[str, int] = {root: 0}
        colour[root] = grey
        while path:
            current = path[-1]
            succ = successors[current]
            i = index[-1]
            if i == len(succ):
                colour[current] = black
                del position[current]
                path.pop()
                index.pop()
                continue
            index[-1] = i + 1
            nxt = succ[i]
            state = colour[nxt]
            if state == white:
                colour[nxt] = grey
                position[nxt] = len(path)
                path.append(nxt)
                index.append(0)
            elif state == grey:
                cycles.append([*path[position[nxt]:], nxt])
                if len(cycles) >= limit:
                    return cycles
    return cycles


def _topological_order(successors: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Kahn's order of an acyclic graph, or None when it has a cycle."""
    indegree = dict.fromkeys(successors, 0)
    for succ in successors.values():
        for target in succ:
            indegree[target] += 1
    ready = deque(nid for nid, deg in indegree.items() if deg == 0)
    order: list[str] = []
    while ready:
        current = ready.popleft()
        order.append(current)
        for target in successors[current]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    return order if len(order) == len(successors) else None


def has_template(source: str) -> bool:
    """Whether ``source`` has template markup (plain text renders as itself)."""
    return "{{" in source or "{%" in source or "{#" in source


def _source_of(site: TemplateSite) -> str:
    """The template to compile: a bare guard is evaluated as one ``{{ }}`` expression."""
    if site.kind == "guard" and not has_template(site.source):
        return "{{ " + site.source + " }}"
    return site.source


def _error_line(site: TemplateSite, offset: object) -> int:
    """File line of a template problem: the site's line plus the problem's line within the
    template (1-based), when lines map one to one (single-line values, ``|`` blocks)."""
    if site.line and site.exact and isinstance(offset, int) and offset > 1:
        return site.line + offset - 1
    return site.line


def _site_name(site: TemplateSite) -> str:
    """Which template a problem is in, as messages name it: ``prompt template``,
    ``input template (input.to)``, ``guard next[0].condition``, ``expression``."""
    if site.kind == "guard":
        return f"guard {site.field}"
    if site.kind == "expression":
        return "expression"
    root = site.field.split(".", 1)[0].split("[", 1)[0]
    return f"{root} template" + ("" if site.field == root else f" ({site.field})")


class _Checker:
    """Runs every whole-DAG check and collects the problems."""

    def __init__(
        self,
        nodes: Mapping[str, Node],
        *,
        file: str,
        sites: Sequence[TemplateSite],
        field_lines: Mapping[tuple[str, str], int],
        tools: Collection[str],
        models: Collection[str],
    ) -> None:
        self.nodes = nodes
        self.file = file
        self.sites = sites
        self.field_lines = field_lines
        self.tools = tools
        self.models = models
        self.problems: list[DagProblem] = []
        # Valid successors (unknown targets dropped), deduplicated, in edge order.
        self.successors: dict[str, list[str]] = {}
        self.predecessors: dict[str, list[str]] = {nid: [] for nid in nodes}
        self.acyclic = True
        # Back edges of bounded loops (not among the successors): (node, index, edge).
        self.back_edges: list[tuple[Node, int, Edge]] = []
        # Each loop's body by closing node, and the closing node of each body node.
        self.bodies: dict[str, tuple[str, ...]] = {}
        self.loop_of: dict[str, str] = {}
        self.labels: dict[str, tuple[str, ...] | None] = {}
        self._ancestors: dict[str, int] | None = None
        self._bit: dict[str, int] = {}

    def problem(
        self,
        code: str,
        message: str,
        *,
        line: int,
        node: str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.problems.append(
            DagProblem(message, self.file, line, node, field, hint, code)
        )

    def line_of(self, node: Node, name: str) -> int:
        return self.field_lines.get((node.id, name), node.line)

    # -- graph ------------------------------------------------------------------------

    def check_targets(self) -> None:
        for node in self.nodes.values():
            succ: dict[str, None] = {}
            for i, edge in enumerate(node.next):
                if edge.target not in self.nodes:
                    self._unknown_target(node, f"next[{i}].target", edge.target, edge.line)
                elif edge.loops:
                    self.back_edges.append((node, i, edge))
                else:
                    succ.setdefault(edge.target, None)
            if node.on_failure is not None:
                if node.on_failure in self.nodes:
                    succ.setdefault(node.on_failure, None)
                else:
                    line = self.line_of(node, "on_failure")
                    self._unknown_target(node, "on_failure", node.on_failure, line)
            self.successors[node.id] = list(succ)
            for target in succ:
                self.predecessors[target].append(node.id)

    def _unknown_target(self, node: Node, field: str, target: str, line: int) -> None:
        hint = did_you_mean(target, self.nodes)
        self.problem(
            "unknown-target",
            f"{field} names {target!r}, which is not a node of this DAG",
            line=line or node.line,
            node=node.id,
            field=field,
            hint=hint or f"nodes are: {', '.join(sorted(self.nodes)[:20])}",
        )

    def check_cycles(self) -> None:
        cycles = find_cycles(self.successors)
        self.acyclic = not cycles
        for cycle in cycles:
            source, target = cycle[-2], cycle[-1]
            self.problem(
                "cycle",
                f"cycle: {' -> '.join(cycle)}",
                line=self._edge_line(source, target),
                node=source,
                field="next",
                hint=(
                    "to loop on purpose, bound the loop: give the edge back to the loop's "
                    f"start ({source} -> {target}) `max_visits:` and a guard (`condition:` "
                    f"or `when:`); otherwise remove the edge {source} -> {target}, or use "
                    "`retry:` to repeat a node"
                ),
            )

    def _reaches(self, start: str, goal: str) -> bool:
        """Whether forward edges lead from ``start`` to ``goal`` (or they are the same)."""
        seen = {start}
        work = [start]
        while work:
            current = work.pop()
            if current == goal:
                return True
            for target in self.successors[current]:
                if target not in seen:
                    seen.add(target)
                    work.append(target)
        return False

    def _edge_field(self, source: str, target: str) -> str:
        node = self.nodes[source]
        for i, edge in enumerate(node.next):
            if edge.target == target and not edge.loops:
                return f"next[{i}]"
        return "on_failure" if node.on_failure == target else "next"

    def check_loops(self) -> None:
        """Back edges (``max_visits``) close loops, one per node; loops are entered at
        their first node and left from their last, share no node and hold no map."""
        if not self.acyclic or not self.back_edges:
            return  # with a forward cycle, loop bodies mean nothing: the cycle is reported
        closes: dict[str, int] = {}
        for node, i, edge in self.back_edges:
            field = f"next[{i}]"
            if node.id in closes:
                self.problem(
                    "bad-edge",
                    f"{field}: a second edge with max_visits; {node.id} already closes a "
                    f"loop with next[{closes[node.id]}], and a node may close one loop only",
                    line=edge.line or node.line, node=node.id, field=f"{field}.max_visits",
                    hint="remove max_visits from one of the edges",
                )
                continue
            closes[node.id] = i
            if not self._reaches(edge.target, node.id):
                self.problem(
                    "bad-edge",
                    f"{field}: max_visits on an edge that closes no loop: {edge.target} "
                    f"does not lead back to {node.id}",
                    line=edge.line or node.line, node=node.id, field=f"{field}.max_visits",
                    hint="max_visits marks the edge from a loop's last node back to its "
                    "first; remove it from a forward edge",
                )
        loops = Dag(name="", nodes=self.nodes).loops
        owner: dict[str, str] = {}
        for closer, body in loops.items():
            if closer not in self.nodes:
                continue  # a loop of a sub-DAG (flattened in): checked with its DAG
            back = self.nodes[closer].loop_edge
            if not body or back is None:
                continue
            field = f"next[{closes.get(closer, 0)}].max_visits"
            shared = [nid for nid in body if nid in owner]
            if shared:
                self.problem(
                    "bad-loop",
                    f"the loop from {back.target} to {closer} shares {', '.join(shared)} "
                    f"with the loop closed by {owner[shared[0]]}: nested or overlapping "
                    "loops are not supported yet",
                    line=back.line or self.nodes[closer].line, node=closer, field=field,
                    hint="make the loops follow one another, without common nodes",
                )
            for nid in body:
                owner.setdefault(nid, closer)
            self.bodies[closer] = body
            if not shared:
                self._check_loop_body(back.target, closer, body)
        self.loop_of = owner

    def _check_loop_body(self, first: str, closer: str, body: tuple[str, ...]) -> None:
        members = set(body)
        where = f"the loop from {first} to {closer}"
        for nid in body:
            node = self.nodes[nid]
            if node.map is not None:
                self.problem(
                    "bad-loop",
                    f"map node {nid} is inside {where}: a map node in a loop is not "
                    "supported yet",
                    line=self.line_of(node, "map"), node=nid, field="map",
                    hint="run the map before or after the loop",
                )
            if nid != closer:
                for target in self.successors[nid]:
                    if target in members:
                        continue
                    field = self._edge_field(nid, target)
                    self.problem(
                        "bad-edge",
                        f"{field}: {nid} leads to {target}, out of {where}; exits from a "
                        f"loop must leave from its last node, {closer}",
                        line=self._edge_line(nid, target), node=nid, field=field,
                        hint=f"lead the exit from {closer} (with a guard that is false when "
                        "the loop goes round again), or move it out of the loop",
                    )
            if nid != first:
                for pred in self.predecessors[nid]:
                    if pred in members:
                        continue
                    field = self._edge_field(pred, nid)
                    self.problem(
                        "bad-edge",
                        f"{field}: {pred} -> {nid} enters {where} in the middle; only the "
                        f"loop's first node {first} may be entered from outside the loop",
                        line=self._edge_line(pred, nid), node=pred, field=field,
                        hint=f"lead the edge to {first}",
                    )

    def _edge_line(self, source: str, target: str) -> int:
        node = self.nodes[source]
        for edge in node.next:
            if edge.target == target and edge.line and not edge.loops:
                return edge.line
        if node.on_failure == target:
            return self.line_of(node, "on_failure")
        return self.line_of(node, "next")

    def check_reachable(self) -> None:
        entries = [nid for nid, preds in self.predecessors.items() if not preds]
        if not entries:
            return  # every node has a predecessor: the cycle problems say why
        seen = set(entries)
        queue = deque(entries)
        while queue:
            for target in self.successors[queue.popleft()]:
                if target not in seen:
                    seen.add(target)
                    queue.append(target)
        shown = ", ".join(entries[:10]) + (", ..." if len(entries) > 10 else "")
        for nid, node in self.nodes.items():
            if nid not in seen:
                self.problem(
                    "unreachable",
                    "is not reachable from any entry node",
                    line=node.line,
                    node=nid,
                    hint=f"entry nodes (no predecessors) are: {shown}; "
                    "add an edge to this node from one of them or their successors",
                )

    def check_condition_inputs(self) -> None:
        for nid, node in self.nodes.items():
            preds = self.predecessors[nid]
            if node.type == "condition" and node.input is None and len(preds) > 1:
                self.problem(
                    "condition-join",
                    f"condition node has {len(preds)} predecessors ({', '.join(preds)}); "
                    "`output` in its expression must be the output of a single node",
                    line=node.line,
                    node=nid,
                    hint="set the condition's `input:` (it becomes `output`), or join the "
                    "branches in a node of their own (e.g. tool_call echo) first",
                )

    # -- names --------------------------------------------------------------------------

    def check_names(self) -> None:
        for node in self.nodes.values():
            if node.type == "tool_call" and node.tool is not None:
                self._known(node, "tool", node.tool, self.tools, "unknown-tool")
            if node.type == "llm_call":
                if node.model is not None:
                    self._known(node, "model", node.model, self.models, "unknown-model")
                if node.fallback is not None:
                    self._known(
                        node, "fallback.model", node.fallback.model, self.models,
                        "unknown-model",
                    )

    def _known(
        self, node: Node, field: str, name: str, known: Collection[str], code: str
    ) -> None:
        if name in known:
            return
        kind = "tool" if code == "unknown-tool" else "model"
        listed = ", ".join(sorted(known)) or "none"
        close = did_you_mean(name, known)
        self.problem(
            code,
            f"unknown {kind} {name!r}",
            line=self.line_of(node, field),
            node=node.id,
            field=field,
            hint=f"{close + ' ' if close else ''}known {kind}s: {listed}",
        )

    # -- templates ----------------------------------------------------------------------

    def check_templates(self) -> None:
        for site in self.sites:
            if site.node == "" and site.field == "output":
                self._check_output(site)
                continue
            node = self.nodes.get(site.node)
            if node is None or node.type not in NODE_TYPES:
                continue
            try:
                if site.kind == "expression":
                    # Checks either form; None (any label) for the template form.
                    self.labels[site.node] = template.expression_labels(site.source)
                elif site.kind != "guard" and not has_template(site.source):
                    continue
                # Simple forms are read without Jinja, the others from the tree compiled
                # above or now (cached): nothing is compiled twice.
                found = template.check_template(site.source, kind=site.kind)
            except TemplateError as exc:
                self.labels.setdefault(site.node, None)
                unsafe = isinstance(exc, TemplateSecurityError)
                what = "is refused" if unsafe else "does not compile"
                self.problem(
                    "unsafe-template" if unsafe else "template-syntax",
                    f"{_site_name(site)} {what}: {exc}",
                    line=_error_line(site, getattr(exc, "line", 0)),
                    node=site.node,
                    field=site.field,
                    hint=_UNSAFE_HINT if unsafe else _SYNTAX_HINTS[site.kind],
                )
                continue
            for found_problem in found:
                message, hint = found_problem.message, found_problem.hint
                name = _SCOPED_NAMES.get(message) if found_problem.code == "unknown-name" \
                    else None
                if name is not None:
                    scoped = self._scoped_name(site, node, name)
                    if scoped is None:
                        continue  # defined where this template runs
                    message, hint = scoped
                self.problem(
                    found_problem.code,
                    f"{_site_name(site)}: {message}",
                    line=_error_line(site, found_problem.line),
                    node=site.node,
                    field=site.field,
                    hint=hint,
                )
            if site.field == "prompt" and node.input is not None:
                self._check_prompt_input(site)
            self._check_references(site, node)
            self._check_previous(site, node)

    def _check_output(self, site: TemplateSite) -> None:
        """The DAG's ``output``: a template read once the DAG's nodes are done, when it
        runs as a sub-DAG; any of its nodes may be read."""
        if not has_template(site.source):
            return
        try:
            found = template.check_template(site.source, kind="template")
            refs = template.referenced_nodes(site.source)
        except TemplateError as exc:
            unsafe = isinstance(exc, TemplateSecurityError)
            what = "is refused" if unsafe else "does not compile"
            self.problem(
                "unsafe-template" if unsafe else "template-syntax",
                f"output template {what}: {exc}",
                line=_error_line(site, getattr(exc, "line", 0)), field="output",
                hint=_UNSAFE_HINT if unsafe else _TEMPLATE_HINT,
            )
            return
        for found_problem in found:
            self.problem(found_problem.code, f"output template: {found_problem.message}",
                         line=_error_line(site, found_problem.line), field="output",
                         hint=found_problem.hint)
        for ref in sorted(refs or ()):
            if ref not in self.nodes:
                self.problem(
                    "bad-reference",
                    f"output: reads nodes.{ref}.output, but there is no node {ref!r}",
                    line=site.line, field="output",
                    hint=did_you_mean(ref, self.nodes)
                    or f"nodes are: {', '.join(sorted(self.nodes)[:20])}",
                )

    def _scoped_name(self, site: TemplateSite, node: Node, name: str) -> tuple[str, str] | None:
        """None when ``name`` (``item``, ``index``, ``visit``, ``previous``) is defined in
        ``site``; otherwise the message and hint saying where it is."""
        if name in ("item", "index"):
            # A map node declares `map:` (which may have a problem of its own).
            if node.map is None and (node.id, "map") not in self.field_lines:
                return (f"`{name}` is only defined in a map node's templates",
                        f"add `map:` to run {node.id} once per item, e.g. {_MAP_EXAMPLE}")
            root = site.field.split(".", 1)[0].split("[", 1)[0]
            if root in ("input", "prompt"):
                return None
            return (f"`{name}` is only defined in a map node's input and prompt (one item "
                    "at a time)", "the map template renders the whole list; guards read "
                    "the node's output (every item's result)")
        if not self.acyclic or node.id in self.loop_of:
            return None  # with a plain cycle, loops are not known: the cycle is reported
        return (f"`{name}` is only defined in the templates of a loop's nodes",
                f"{node.id} is in no loop; {_LOOP_HINT}")

    def _check_previous(self, site: TemplateSite, node: Node) -> None:
        """``previous.<id>`` must name a node of the loop ``node`` is in."""
        closer = self.loop_of.get(node.id)
        if closer is None or "previous" not in site.source:
            return
        body = self.bodies[closer]
        back = self.nodes[closer].loop_edge
        first = back.target if back is not None else body[0]
        code = template.normalize(_source_of(site))
        for found in _PREVIOUS.finditer(code):
            ref = found.group(1) or found.group(3)
            if ref in body:
                continue
            close = did_you_mean(ref, body)
            self.problem(
                "bad-reference",
                f"{site.field}: reads previous.{ref}, but {ref!r} is not a node of the "
                f"loop from {first} to {closer} ({', '.join(body)})",
                line=_error_line(site, code.count("\n", 0, found.start()) + 1),
                node=node.id,
                field=site.field,
                hint=f"{close + ' ' if close else ''}previous.<id> is the output of a node "
                "of this loop in the previous visit; read other nodes as nodes.<id>.output",
            )

    def check_maps(self) -> None:
        """A map template that reads nothing renders the same list every time: render it
        now, and refuse what is not a list."""
        for node in self.nodes.values():
            if node.map is None or node.type not in NODE_TYPES:
                continue
            try:
                if template.names_read(node.map):
                    continue
                value = template.render(node.map, {})
            except TemplateError as exc:
                if _compiles(node.map):
                    self.problem(
                        "bad-value", f"map of {node.id} does not render: {exc}",
                        line=self.line_of(node, "map"), node=node.id, field="map",
                        hint=f"map renders the list the node runs over, e.g. {_MAP_EXAMPLE}",
                    )
                continue
            if not isinstance(value, list):
                self.problem(
                    "bad-value", f"map of {node.id} renders {_value_kind(value)}, not a list",
                    line=self.line_of(node, "map"), node=node.id, field="map",
                    hint=f"map renders the list the node runs over, e.g. {_MAP_EXAMPLE}",
                )

    def _check_prompt_input(self, site: TemplateSite) -> None:
        """Refuse ``input`` in the prompt of a node that declares ``input:``.

        Until ``node.input`` existed, such a prompt read ``input`` as the node's own
        rendered input; ``input`` is now the task input everywhere. Rendering the old
        form with the new meaning would change what existing DAGs send to the model
        without a word, so it is refused with the rewrite to make.
        """
        line = template.names_read(site.source).get("input")
        if line is None:
            return
        self.problem(
            "ambiguous-input",
            "prompt template reads `input` on a node that declares `input:`; in a prompt "
            "`input` is the task input (as in every template), not this node's input",
            line=_error_line(site, line),
            node=site.node,
            field=site.field,
            hint="write `node.input` (e.g. {{ .node.input.name }}) for this node's rendered "
            "input, which is what `input` meant here before; to use the task input, pass "
            "it through the node's `input:` and read it as node.input too",
        )

    def _check_references(self, site: TemplateSite, node: Node) -> None:
        try:
            refs = template.referenced_nodes(_source_of(site))
        except TemplateError:
            return  # does not compile: reported by check_templates
        if not refs:
            return
        for ref in sorted(refs):
            reason: str | None = None
            hint: str | None = None
            if ref not in self.nodes:
                reason = f"there is no node {ref!r}"
                hint = did_you_mean(ref, self.nodes)
            elif ref == node.id:
                # Guards run before the node's own result is committed: they read it
                # as `output`, never as nodes.<self>.output.
                reason = "a node cannot read its own output that way"
                hint = "read `output` in the node's `next` guards"
            elif self.acyclic and not self._is_ancestor(ref, node.id):
                reason = f"{ref!r} does not run before {node.id!r} (not an ancestor)"
                hint = f"add a path of edges from {ref!r} to {node.id!r}, or read `input`"
            if reason is not None:
                self.problem(
                    "bad-reference",
                    f"{site.field}: reads nodes.{ref}.output, but {reason}",
                    line=site.line or node.line,
                    node=node.id,
                    field=site.field,
                    hint=hint,
                )

    def _is_ancestor(self, ref: str, nid: str) -> bool:
        if self._ancestors is None:
            order = _topological_order(self.successors)
            assert order is not None, "only called on an acyclic graph"
            self._bit = {name: 1 << i for i, name in enumerate(order)}
            ancestors = dict.fromkeys(order, 0)
            # Ancestor sets as int bitsets: one OR per edge, in topological order.
            for name in order:
                mine = ancestors[name] | self._bit[name]
                for target in self.successors[name]:
                    ancestors[target] |= mine
            self._ancestors = ancestors
        return bool(self._ancestors[nid] & self._bit[ref])

    # -- labels -------------------------------------------------------------------------

    def check_edges(self) -> None:
        for node in self.nodes.values():
            labels = self.labels.get(node.id)
            for i, edge in enumerate(node.next):
                if edge.when is None:
                    continue
                field = f"next[{i}].when"
                if node.type != "condition":
                    if node.type in NODE_TYPES:
                        self.problem(
                            "bad-edge",
                            f"`when:` is only valid on edges of a condition node, "
                            f"not on a {node.type}",
                            line=edge.line or node.line,
                            node=node.id,
                            field=field,
                            hint="use a guard: condition: \"{{ .output.field == 'value' }}\"",
                        )
                    continue
                if labels is not None and edge.when not in labels:
                    close = did_you_mean(edge.when, labels)
                    self.problem(
                        "unknown-label",
                        f"{field}: the expression never produces {edge.when!r}",
                        line=edge.line or node.line,
                        node=node.id,
                        field=field,
                        hint=f"{close + ' ' if close else ''}it can produce: "
                        f"{', '.join(labels)}",
                    )


def _compiles(source: str) -> bool:
    """Whether ``source`` compiles (else ``check_templates`` has reported it)."""
    try:
        template.compile_template(source)
    except TemplateError:
        return False
    return True


def _value_kind(value: Any) -> str:
    """What a rendered value is, in the document's words."""
    if value is None:
        return "null"
    for types, word in ((bool, "a boolean"), (int | float, "a number"), (str, "a string"),
                        (Mapping, "a mapping")):
        if isinstance(value, types):
            return word
    return f"a {type(value).__name__}"


def _in_subdag(nid: str, nodes: Mapping[str, Node]) -> bool:
    """Whether ``nid`` is a flattened node of a sub-DAG (``review/check``)."""
    if SCOPE not in nid:
        return False
    owner = nodes.get(nid.split(SCOPE, 1)[0])
    return owner is not None and owner.subdag is not None


def check_dag(
    nodes: Mapping[str, Node],
    *,
    file: str,
    sites: Sequence[TemplateSite],
    field_lines: Mapping[tuple[str, str], int],
    tools: Collection[str],
    models: Collection[str],
) -> list[DagProblem]:
    """Run every whole-DAG check and return the problems found (empty when valid).

    Args:
        nodes: The loaded nodes, including ones with field problems (so their ids
            still resolve as edge targets). Nodes of unknown type are skipped by the
            type-specific checks. The nodes of sub-DAGs flattened in (``{dag
            node}/{child id}``) are left out: they were checked with their DAG.
        file: File name used in the problems.
        sites: Every template of the DAG with its location.
        field_lines: Line of each ``(node id, field)`` for messages.
        tools: Tool names a ``tool_call`` may use.
        models: Model names an ``llm_call`` (or its fallback) may use.

    Returns:
        The problems, in check order.
    """
    # Nodes of a sub-DAG ({dag node}/{child id}) were checked with their own DAG.
    nodes = {nid: node for nid, node in nodes.items() if not _in_subdag(nid, nodes)}
    checker = _Checker(
        nodes, file=file, sites=sites, field_lines=field_lines, tools=tools, models=models
    )
    checker.check_targets()
    checker.check_cycles()
    checker.check_loops()
    checker.check_reachable()
    checker.check_condition_inputs()
    checker.check_names()
    checker.check_templates()
    checker.check_maps()
    checker.check_edges()
    return checker.problems
