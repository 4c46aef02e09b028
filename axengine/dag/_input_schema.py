"""A DAG's optional ``input_schema:``: a JSON Schema the task input must match.

The schema itself is checked when the DAG is loaded (``ax validate``, every submit), so a
bad schema is a DAG problem at its line; the task input is checked by
:func:`check_task_input` when a task is submitted, before anything is stored. Only local
references (``#/...``) are allowed: validating an input never fetches anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from axengine.errors import InputError

# jsonschema is imported where it is used: it costs ~50 ms, and most DAGs (and every
# `ax` command that loads none) never need it.

__all__ = ["check_task_input", "input_path", "schema_problems"]

#: Most input mismatches one refusal lists (the first is the most relevant one).
MAX_REPORTED = 5


def input_path(path: Iterable[Any], root: str = "input") -> str:
    """A JSON path as the DAG language writes it: ``input.order.items[2].qty``."""
    out = root
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _remote_refs(schema: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[Any, ...]]:
    """Paths of ``$ref`` values that are not local (``#...``), iteratively."""
    work: list[tuple[Any, tuple[Any, ...]]] = [(schema, path)]
    while work:
        value, where = work.pop()
        if isinstance(value, Mapping):
            ref = value.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                yield (*where, "$ref")
            work.extend((v, (*where, k)) for k, v in value.items())
        elif isinstance(value, list):
            work.extend((v, (*where, i)) for i, v in enumerate(value))


def schema_problems(schema: Any) -> list[tuple[tuple[Any, ...], str]]:
    """Why ``schema`` is not a usable input schema: ``(path in the schema, message)``
    pairs, empty when it is one."""
    if not isinstance(schema, Mapping):
        return [((), "input_schema must be a JSON Schema mapping (e.g. {type: object})")]
    import jsonschema  # type: ignore[import-untyped]  # ships no stubs

    validator = jsonschema.validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = tuple(exc.path)
        at = f" at {input_path(where, 'input_schema')}" if where else ""
        return [(where, f"input_schema is not a valid JSON Schema{at}: {exc.message}")]
    return [(where, f"input_schema: {input_path(where, 'input_schema')} is not local: "
             "only references inside the schema (#/...) are allowed")
            for where in sorted(_remote_refs(schema), key=str)]


def check_task_input(schema: Mapping[str, Any] | None, value: Any) -> None:
    """Refuse a task input that does not match the DAG's ``input_schema``.

    Raises:
        InputError: ``value`` does not match; the message names the field path of each
            mismatch (``input.amount: 'x' is not of type 'number'``), most relevant first.
    """
    if schema is None:
        return
    import jsonschema
    import referencing.exceptions

    validator = jsonschema.validators.validator_for(schema)(schema)
    try:
        errors = list(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:  # a local $ref to nowhere
        raise InputError(f"input_schema: cannot resolve {exc}") from exc
    if not errors:
        return
    errors.sort(key=jsonschema.exceptions.relevance)  # least relevant first
    shown = [f"{input_path(e.absolute_path)}: {e.message}"
             for e in reversed(errors[-MAX_REPORTED:])]
    more = f" (and {len(errors) - MAX_REPORTED} more)" if len(errors) > MAX_REPORTED else ""
    raise InputError("task input does not match the DAG's input_schema: "
                     + "; ".join(shown) + more)
