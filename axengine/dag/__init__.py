"""The DAG language: typed model, YAML loader and validator, graph rendering.

``load_dag`` / ``load_dag_text`` / ``load_dag_mapping`` return a validated, immutable
:class:`Dag` or raise :class:`~axengine.errors.DagError` listing every problem (with
file:line, node, field, hint and a stable code). ``validate_file`` returns the problems
instead of raising. ``to_mermaid`` and ``to_dot`` draw a DAG. ``parse_quantity`` reads
the Kubernetes quantities of a node's ``resources:``; ``check_task_input`` checks a task
input against the DAG's ``input_schema:``. The language itself is described
in ``docs/dag-language.md``.
"""

from __future__ import annotations

from axengine.dag._input_schema import check_task_input
from axengine.dag._loader import (
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_YAML_NODES,
    load_dag,
    load_dag_mapping,
    load_dag_text,
    validate_file,
)
from axengine.dag._model import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    ITEM_FAILURE_POLICIES,
    MAX_MAP_ITEMS,
    MAX_MAP_ITEMS_LIMIT,
    NODE_TYPES,
    SCOPE,
    Dag,
    Edge,
    Fallback,
    Node,
    NodeType,
    base_id,
    is_item,
    is_visit,
    item_id,
    visit_id,
)
from axengine.dag._render_graph import to_dot, to_mermaid
from axengine.dag._resources import RESOURCE_NAMES, RESOURCE_SECTIONS, RUNNERS, parse_quantity
from axengine.dag._schema import MAX_DAG_NODES
from axengine.dag._validate import find_cycles

__all__ = [
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT",
    "ITEM_FAILURE_POLICIES",
    "MAX_DAG_NODES",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_MAP_ITEMS",
    "MAX_MAP_ITEMS_LIMIT",
    "MAX_YAML_NODES",
    "NODE_TYPES",
    "RESOURCE_NAMES",
    "RESOURCE_SECTIONS",
    "RUNNERS",
    "SCOPE",
    "Dag",
    "Edge",
    "Fallback",
    "Node",
    "NodeType",
    "base_id",
    "check_task_input",
    "find_cycles",
    "is_item",
    "is_visit",
    "item_id",
    "load_dag",
    "load_dag_mapping",
    "load_dag_text",
    "parse_quantity",
    "to_dot",
    "to_mermaid",
    "validate_file",
    "visit_id",
]
