"""Server-rendered SVG charts: no JavaScript, readable without a chart library.

Every text that reaches the SVG goes through format_html, so a pool's name
cannot inject markup.
"""

import math
from collections.abc import Sequence
from datetime import date

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe


def interruptions_per_day(daily: Sequence[tuple[date, int]], *, title: str, width: int = 600, height: int = 140) -> SafeString:
    """A bar per day; the tallest bar fills the plot; each bar has a tooltip."""
    left, bottom, top = 28, 22, 10
    plot_w, plot_h = width - left - 6, height - bottom - top
    peak = max((n for _, n in daily), default=0)
    scale = max(peak, 1)
    slot = plot_w / max(len(daily), 1)
    bars = []
    for i, (day, n) in enumerate(daily):
        h = plot_h * n / scale
        x = left + i * slot + slot * 0.15
        y = top + plot_h - h
        bars.append((f"{x:.1f}", f"{y:.1f}", f"{slot * 0.7:.1f}", f"{h:.1f}", f"{day:%b %d}: {n} interruption{'s' if n != 1 else ''}"))
    first = daily[0][0].strftime("%b %d") if daily else ""
    last = daily[-1][0].strftime("%b %d") if daily else ""
    body = format_html_join(
        "", '<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="#c2410c"><title>{}</title></rect>', bars
    )
    return format_html(
        '<svg class="chart" viewBox="0 0 {w} {h}" width="100%" style="max-width:{w}px;height:auto" role="img" aria-label="{title}">'
        "<title>{title}</title>"
        '<line x1="{l}" y1="{base}" x2="{r}" y2="{base}" stroke="#888"/>'
        '<text x="{lm}" y="{ty}" font-size="10" text-anchor="end">{peak}</text>'
        '<text x="{lm}" y="{base}" font-size="10" text-anchor="end">0</text>'
        "{body}"
        '<text x="{l}" y="{ly}" font-size="10">{first}</text>'
        '<text x="{r}" y="{ly}" font-size="10" text-anchor="end">{last}</text>'
        "</svg>",
        w=width, h=height, title=title, l=left, r=width - 6, base=f"{top + plot_h:.1f}", lm=left - 4,
        ty=top + 8, peak=peak, body=body, ly=height - 6, first=first, last=last,
    )


def discount_curve(
    points: Sequence[tuple[float, float | None]], *, optimum: float, chosen: float | None = None,
    width: int = 600, height: int = 220,
) -> SafeString:
    """Effective discount against the checkpoint interval T (log scale), the optimum marked."""
    usable = [(t, v) for t, v in points if v is not None]
    if not usable:
        return mark_safe("")
    left, right, top, bottom = 48, 10, 12, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    t_lo, t_hi = math.log(points[0][0]), math.log(points[-1][0])
    v_lo = min(min(v for _, v in usable), 0.0)
    v_hi = max(max(v for _, v in usable), 0.0)
    span = (v_hi - v_lo) or 1.0

    def x(t: float) -> float:
        return left + plot_w * (math.log(t) - t_lo) / ((t_hi - t_lo) or 1.0)

    def y(v: float) -> float:
        return top + plot_h * (v_hi - v) / span

    segments, current = [], []
    for t, v in points:
        if v is None:
            if current:
                segments.append(current)
            current = []
        else:
            current.append(f"{x(t):.1f},{y(v):.1f}")
    if current:
        segments.append(current)
    lines = format_html_join(
        "", '<polyline points="{}" fill="none" stroke="#1d4ed8" stroke-width="2"/>', ((" ".join(s),) for s in segments)
    )
    marks = [(f"{x(optimum):.1f}", top, f"{top + plot_h}", "#15803d", f"T_opt = {optimum:.3g} h")]
    if chosen is not None and abs(chosen - optimum) > 1e-9 and points[0][0] <= chosen <= points[-1][0]:
        marks.append((f"{x(chosen):.1f}", top, f"{top + plot_h}", "#a16207", f"T = {chosen:.3g} h"))
    markers = format_html_join(
        "",
        '<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="{3}" stroke-dasharray="4 3"><title>{4}</title></line>'
        '<text x="{0}" y="{1}" font-size="10" dx="3" dy="9" fill="{3}">{4}</text>',
        marks,
    )
    return format_html(
        '<svg class="chart" viewBox="0 0 {w} {h}" width="100%" style="max-width:{w}px;height:auto" role="img" '
        'aria-label="Effective discount against checkpoint interval">'
        "<title>Effective discount against checkpoint interval</title>"
        '<line x1="{l}" y1="{zero}" x2="{r}" y2="{zero}" stroke="#888"/>'
        '<text x="{lm}" y="{ytop}" font-size="10" text-anchor="end">{vhi}</text>'
        '<text x="{lm}" y="{ybot}" font-size="10" text-anchor="end">{vlo}</text>'
        "{lines}{markers}"
        '<text x="{l}" y="{ly}" font-size="10">T = {tlo} h</text>'
        '<text x="{r}" y="{ly}" font-size="10" text-anchor="end">T = {thi} h (log scale)</text>'
        "</svg>",
        w=width, h=height, l=left, r=width - right, zero=f"{y(0.0):.1f}", lm=left - 4,
        ytop=top + 8, ybot=top + plot_h, vhi=f"{v_hi:.0%}", vlo=f"{v_lo:.0%}", lines=lines, markers=markers,
        ly=height - 8, tlo=f"{points[0][0]:.3g}", thi=f"{points[-1][0]:.3g}",
    )
