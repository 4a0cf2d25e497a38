"""HTML pieces every report section uses: escaping, and line plots as inline SVG (no scripts, no network)."""

from __future__ import annotations

import html
import math


def esc(value) -> str:
    return html.escape(str(value))


def svg_plot(series: dict[str, tuple[list[int], list[float]]], title: str, width: int = 560,
             height: int = 200, xlabel: str = "step") -> str:
    """A log-scale line plot of y >= 0 values as inline SVG (zeros drawn at the floor)."""
    colours = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700"]
    points = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys, strict=False) if y == y]
    if not points:
        return f"<p>{esc(title)}: no shared steps to plot.</p>"
    positive = [y for _, y in points if y > 0] or [1e-9]
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    hi = max(hi, lo + 1)
    x_max = max(max(x for x, _ in points), 1)
    left, right, top, bottom = 50, 10, 24, 28

    def sx(x: float) -> float:
        return left + (width - left - right) * x / x_max

    def sy(y: float) -> float:
        v = math.log10(y) if y > 0 else lo
        return top + (height - top - bottom) * (hi - min(max(v, lo), hi)) / (hi - lo)

    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img"><title>{esc(title)}</title>',
             f'<text x="{left}" y="14" font-size="12">{esc(title)}</text>']
    for exp in range(lo, hi + 1):
        y = sy(10.0 ** exp)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="4" y="{y + 4:.1f}" font-size="10">1e{exp}</text>')
    parts.append(f'<text x="{width - 60}" y="{height - 6}" font-size="10">{esc(xlabel)} (0..{x_max})</text>')
    for i, (name, (xs, ys)) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=False) if y == y)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        parts.append(f'<text x="{left + 10 + 150 * i}" y="{height - 6}" font-size="11" fill="{colour}">'
                     f'{esc(name)}</text>')
    return "".join(parts) + "</svg>"


def expected_table(table_id: str, headers: list[str], cells: list[list[str]], expected: list[bool]) -> str:
    """A verdict family's table: a row not as expected is marked (class "no")."""
    rows = "".join(f"<tr class='{'' if ok else 'no'}'>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                   for row, ok in zip(cells, expected, strict=True))
    return f"<table id='{table_id}'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + f"</tr>{rows}</table>"
