"""The template sandbox: render inputs, evaluate guards and condition expressions.

Every template in a DAG (node inputs, prompts, ``next[].condition`` guards and the
``expression`` of a condition node) goes through this package and nothing else. Templates
are Jinja2 in an :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` with
:class:`~jinja2.StrictUndefined`, tightened further:

* Names: ``input`` (the task input), ``output`` (guards and expressions), ``node.input``
  (prompts and gate descriptions: the node's own rendered input), ``nodes.<id>.output``,
  ``task`` and a bounded ``range``. No ``lipsum``/``cycler``/``joiner``/``namespace``/``dict``.
* Attributes and calls are allowlisted per type (a few ``str``/``dict``/``list`` methods,
  ``loop`` helpers, macros); anything starting with ``_``, ``format``/``format_map``,
  ``mro`` and every other callable is refused with :class:`TemplateSecurityError`.
  ``include``/``import``/``extends`` are refused when the template is compiled.
* Bounds (:class:`TemplateLimitError`): ``range`` length, ``*`` repetition, ``**`` and
  integer ``*`` size, ``%`` widths, output size, a per-render budget of characters built
  in intermediate values, and CPU time. Time is enforced by a ``sys.settrace`` hook
  installed only while a template runs, so loops that print nothing and recursive
  macros are interrupted too; the hook is removed (the previous one restored) after.
* Go-style leading dots from the seed (``.input.x``) mean ``input.x`` (:func:`normalize`).
* :func:`check_template` finds statically, without rendering, what the sandbox would
  refuse whatever the data (unknown names, ``_`` attributes, forbidden calls), so that
  ``ax validate`` rejects it; the sandbox stays the wall that holds at run time.

Every error raised carries ``line``: the 1-based line within the template source, or 0.

Layout, each module depending only on those above it:

* ``_budget``: the bounds, the per-render session, the trace hook, error mapping.
* ``_values``: what may be printed or returned; checks on operations that build text.
* ``_filters``: the filter table, each filter bounded or charged.
* ``_sandbox``: the environment, allowlisted attributes and calls, intercepted operators.
* ``_normalize``: leading-dot rewriting.
* ``_fast``: templates that only read values (paths, constants, one comparison,
  ``and``/``or``/``not``), evaluated from their compiled tree without Jinja; anything
  else, and any miss, goes through Jinja.
* ``_compiler``: compiling (cached) and running one template.
* ``_simple``: the simple forms (paths, comparisons, known filters) that the static check
  reads without Jinja, so that validating a large DAG compiles nothing.
* ``_api``: :func:`render`, :func:`render_value`, :func:`evaluate_guard`, the context.
* ``_expression``: the ``if/elif/else`` form of a condition node.
* ``_static``: :func:`check_template`, the static check ``ax validate`` runs: names,
  ``_`` attributes and calls the sandbox would refuse, found in the syntax tree (or, for
  the simple forms, in the paths ``_simple`` lists).
* ``_refs``: :func:`referenced_nodes`, from the same walk of the syntax tree.
"""

from __future__ import annotations

from axengine.template._api import (
    MISSING,
    compile_template,
    evaluate_guard,
    is_literal,
    literal_value,
    render,
    render_value,
    template_context,
)
from axengine.template._budget import (
    MAX_CALL_DEPTH,
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    MAX_RENDER_SECONDS,
)
from axengine.template._compiler import MAX_NESTING
from axengine.template._expression import evaluate_expression, expression_labels
from axengine.template._normalize import normalize
from axengine.template._refs import referenced_nodes
from axengine.template._static import TemplateKind, TemplateProblem, check_template, names_read

__all__ = [
    "MAX_CALL_DEPTH",
    "MAX_NESTING",
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "MAX_RENDER_SECONDS",
    "MISSING",
    "TemplateKind",
    "TemplateProblem",
    "check_template",
    "compile_template",
    "evaluate_expression",
    "evaluate_guard",
    "expression_labels",
    "is_literal",
    "literal_value",
    "names_read",
    "normalize",
    "referenced_nodes",
    "render",
    "render_value",
    "template_context",
]
