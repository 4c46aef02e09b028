"""What a node asks of the machine that runs it: ``runner:`` and ``resources:``.

``resources`` has the shape of a Kubernetes container's ``resources`` (``requests`` and
``limits`` of ``cpu`` and ``memory``) and its quantities are read with Kubernetes'
grammar, so a DAG that validates here is never refused by the API server for the way a
quantity is written. The Job builder (:mod:`axengine.runners.job`) reuses
:func:`parse_quantity` to merge a node's values over the deployment's defaults.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["RESOURCE_NAMES", "RESOURCE_SECTIONS", "RUNNERS", "parse_quantity"]

#: Runners a node may ask for (``runner:``); unset means "whatever the executor uses".
RUNNERS: tuple[str, ...] = ("thread", "subprocess", "kubernetes")
#: Sections of ``resources:`` (a Kubernetes container's ``resources``).
RESOURCE_SECTIONS: tuple[str, ...] = ("requests", "limits")
#: Resources a node may name in each section.
RESOURCE_NAMES: tuple[str, ...] = ("cpu", "memory")

# Kubernetes' quantity grammar (k8s.io/apimachinery resource.Quantity):
#   <signedNumber><suffix>, suffix = binary SI (Ki..Ei) | decimal SI (m, "", k..E) |
#   decimal exponent (e<signedNumber>, E<signedNumber>).
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[eE][+-]?[0-9]+|[mkMGTPE]?)\Z"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Kubernetes refuses exponents it cannot represent; far past any real machine anyway.
_MAX_EXPONENT = 100


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity (``500m`` → 0.5, ``1Gi`` → 1073741824).

    Args:
        text: The quantity as written (``"1"``, ``"0.5"``, ``"500m"``, ``"256Mi"``,
            ``"1e3"``).

    Returns:
        Its exact value.

    Raises:
        ValueError: ``text`` is not a quantity, or is negative (a resource amount never
            is).
    """
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = match["number"], match["suffix"]
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits numbers only
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from exc
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    if suffix in _BINARY:
        return value * Decimal(2 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return value.scaleb(_DECIMAL[suffix])
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise ValueError(f"{text!r} has an exponent out of range")
    return value.scaleb(exponent)
