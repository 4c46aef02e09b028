"""Two ax tools written as plain Python functions.

``word_stats`` is synchronous and takes its input by keyword (``{"text": ..., "top": 2}``),
validated from its type hints. ``price_quote`` is asynchronous, takes the whole input as
one pydantic model and receives the node's context through its ``ctx`` parameter.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

import axengine as ax

if TYPE_CHECKING:  # only for type checkers: ax never needs it at run time
    from executors.contract import NodeContext

#: Unit prices in EUR by SKU (a stand-in for a price service).
PRICES = {"AX-100": Decimal("12.50"), "AX-200": Decimal("40.00")}
#: EUR → other currencies.
RATES = {"EUR": Decimal("1"), "USD": Decimal("1.10")}


@ax.tool("word_stats")
def word_stats(text: str, top: int = 3) -> dict[str, object]:
    """Count the words of ``text`` and name the ``top`` most frequent ones."""
    words = re.findall(r"[a-z']+", text.lower())
    ranked = sorted(Counter(words).items(), key=lambda item: (-item[1], item[0]))
    return {"words": len(words), "top": [word for word, _ in ranked[:top]]}


class Order(BaseModel):
    """The input of ``price_quote``."""

    sku: str
    quantity: int = Field(gt=0)
    currency: Literal["EUR", "USD"] = "EUR"


class Quote(BaseModel):
    """The output of ``price_quote``."""

    sku: str
    quantity: int
    currency: str
    unit_price: float
    total: float


@ax.tool("price_quote")
async def price_quote(order: Order, ctx: NodeContext) -> Quote:
    """Price an order; an unknown SKU fails the node without retry."""
    await asyncio.sleep(0.01)  # a real tool would await a price service here
    unit = PRICES.get(order.sku)
    if unit is None:
        raise ax.ToolError(f"unknown SKU {order.sku!r}; known: {', '.join(sorted(PRICES))}",
                           retryable=False)
    unit = (unit * RATES[order.currency]).quantize(Decimal("0.01"))
    ctx.progress(f"priced {order.sku}")
    return Quote(sku=order.sku, quantity=order.quantity, currency=order.currency,
                 unit_price=float(unit), total=float(unit * order.quantity))
