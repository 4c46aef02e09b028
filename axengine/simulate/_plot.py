"""Completion-time distributions as an SVG, written by hand.

One empirical CDF per policy (the fraction of finished runs whose node result was
available by time *t*), on shared axes, so a policy that kills healthy runs shows as a
curve pushed right and a long tail as a curve that reaches 1 late. Hand-written SVG keeps
the simulator free of plotting dependencies; the output is plain XML that any browser
shows and ``xml.etree`` parses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from axengine.simulate._replay import ReplayResult
from axengine.timeouts import seconds

__all__ = ["PALETTE", "cdf_svg", "nice_ticks"]

#: Series colours (Okabe-Ito: distinguishable with the common colour-vision deficits),
#: reused with a dash pattern past the eighth policy.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")
_DASHES = ("", "6 3", "2 3", "8 3 2 3")

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 50, 60


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Ticks from 0 to at least ``high`` at a step of 1, 2 or 5 times 10^k."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(high / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _label(result: ReplayResult) -> str:
    p50, p99 = result.completion_percentile(50), result.completion_percentile(99)
    if p50 is None or p99 is None:
        return f"{result.policy.name} (no finished runs)"
    return f"{result.policy.name} (p50 {seconds(p50)} s, p99 {seconds(p99)} s)"


def cdf_svg(results: Sequence[ReplayResult],
            title: str = "Completion time by timeout policy") -> str:
    """An SVG document with one empirical CDF of completion times per result."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    high = max((c for r in results for c in r.completions), default=0.0)
    ticks = nice_ticks(high)
    x_max = ticks[-1]

    def x(t: float) -> float:
        return LEFT + plot_w * t / x_max

    def y(f: float) -> float:
        return TOP + plot_h * (1.0 - f)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP / 2 + 5:.1f}" text-anchor="middle" '
        f'font-size="15">{escape(title)}</text>',
        '<g class="axes" stroke="#444" stroke-width="1">',
        f'<line x1="{LEFT}" y1="{y(0):.1f}" x2="{LEFT + plot_w}" y2="{y(0):.1f}"/>',
        f'<line x1="{LEFT}" y1="{y(0):.1f}" x2="{LEFT}" y2="{TOP}"/>',
        "</g>",
        '<g class="ticks" font-size="11" fill="#222">',
    ]
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{y(0):.1f}" x2="{x(t):.1f}" '
                   f'y2="{y(0) + 5:.1f}" stroke="#444"/>')
        out.append(f'<line x1="{x(t):.1f}" y1="{y(0):.1f}" x2="{x(t):.1f}" y2="{TOP}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{x(t):.1f}" y="{y(0) + 18:.1f}" text-anchor="middle">'
                   f"{seconds(t)}</text>")
    for f in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{LEFT - 5}" y1="{y(f):.1f}" x2="{LEFT}" y2="{y(f):.1f}" '
                   'stroke="#444"/>')
        out.append(f'<line x1="{LEFT}" y1="{y(f):.1f}" x2="{LEFT + plot_w}" y2="{y(f):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y(f) + 4:.1f}" text-anchor="end">{f:g}</text>')
    out += [
        "</g>",
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 15}" text-anchor="middle">'
        "completion time (s): the run, plus the re-run after a false kill</text>",
        f'<text transform="translate(18 {TOP + plot_h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle">fraction of finished runs</text>',
    ]
    for i, result in enumerate(results):
        colour = PALETTE[i % len(PALETTE)]
        dash = _DASHES[(i // len(PALETTE)) % len(_DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<g class="series" data-policy={quoteattr(result.policy.name)}>')
        done = result.completions
        if done:
            n = len(done)
            steps = [f"M{x(0):.1f} {y(0):.1f}"]
            for k, t in enumerate(done, start=1):
                steps.append(f"H{x(t):.1f} V{y(k / n):.1f}")
            steps.append(f"H{x(x_max):.1f}")
            out.append(f'<path d="{" ".join(steps)}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"{dash_attr}/>')
        out.append("</g>")
    out.append(f'<g class="legend" transform="translate({LEFT + plot_w + 15} {TOP})">')
    for i, result in enumerate(results):
        colour = PALETTE[i % len(PALETTE)]
        dash = _DASHES[(i // len(PALETTE)) % len(_DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="0" y1="{i * 20}" x2="24" y2="{i * 20}" stroke="{colour}" '
                   f'stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="30" y="{i * 20 + 4}">{escape(_label(result))}</text>')
    out += ["</g>", "</svg>"]
    return "\n".join(out) + "\n"
