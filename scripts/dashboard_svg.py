#!/usr/bin/env python3
"""The fleetops Grafana dashboard as a picture, drawn from what a real Prometheus scraped: each
panel's queries run through Prometheus' HTTP API (query_range) over the window given, and drawn as
an SVG (stdlib only). No data is made up: a series the server did not return is not drawn.

    scripts/dashboard_svg.py --prometheus http://127.0.0.1:9090 \\
        --start 1796620000 --end 1796620600 --out docs/img/dashboard.svg \\
        [--dashboard fleetops/monitoring/fleetops.dashboard.json]"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from xml.sax.saxutils import escape

DASHBOARD = (
    Path(__file__).resolve().parent.parent / "fleetops" / "monitoring" / "fleetops.dashboard.json"
)
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, ROW = 1200, 300  # a Grafana row of 24 columns, 8 units high
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 70, 16, 34, 64


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(
        f"{base.rstrip('/')}/api/v1/query_range?{params}", timeout=30
    ) as answer:
        doc = json.load(answer)
    if doc.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {doc.get('error')}")
    return list(doc["data"]["result"])


def expanded(expr: str) -> str:
    """The dashboard's variables as the whole fleet: $host matches every host."""
    return expr.replace("$host", ".*")


def legend(fmt: str, labels: dict) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def human(value: float, unit: str) -> str:
    if unit == "bytes":
        for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(value) >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    return f"{value:g}"


def tick_step(least: float, base: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten of `base` (1 for counts, 1 GiB for bytes) that is
    at least `least`: whole ticks."""
    scale = base
    while scale * 10 < least:
        scale *= 10
    return next(m * scale for m in (1, 2, 5, 10) if m * scale >= least)


def draw_panel(
    panel: dict,
    series: list[tuple[str, list[tuple[float, float]]]],
    box: tuple[float, float, float, float],
    start: float,
    end: float,
) -> list[str]:
    x0, y0, w, h = box
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    out = [
        (
            f'<g class="panel"><rect x="{x0}" y="{y0}" width="{w}" '
            f'height="{h}" fill="#ffffff" stroke="#d0d0d0"/>'
        ),
        (
            f'<text x="{x0 + 10}" y="{y0 + 21}" font-size="14" '
            f'font-weight="bold">{escape(panel["title"])}</text>'
        ),
    ]
    px, py = x0 + PAD_LEFT, y0 + PAD_TOP
    pw, ph = w - PAD_LEFT - PAD_RIGHT, h - PAD_TOP - PAD_BOTTOM
    values = [v for _, points in series for _, v in points]
    top = 4 * tick_step(max(values + [1.0]) * 1.05 / 4, 1 << 30 if unit == "bytes" else 1)
    out.append(
        f'<rect x="{px}" y="{py}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#e0e0e0"/>'
    )
    for i in range(5):
        value = top * i / 4
        y = py + ph - ph * i / 4
        out.append(f'<line x1="{px}" y1="{y:.1f}" x2="{px + pw}" y2="{y:.1f}" stroke="#eeeeee"/>')
        out.append(
            f'<text x="{px - 6}" y="{y + 4:.1f}" font-size="10" '
            f'text-anchor="end">{escape(human(value, unit))}'
            "</text>"
        )
    for i in range(5):
        t = start + (end - start) * i / 4
        x = px + pw * i / 4
        out.append(
            f'<text x="{x:.1f}" y="{py + ph + 14}" font-size="10" text-anchor="middle">'
            f"{time.strftime('%H:%M:%S', time.gmtime(t))}</text>"
        )
    if not series:
        out.append(
            f'<text x="{px + pw / 2}" y="{py + ph / 2}" '
            'font-size="12" text-anchor="middle" fill="#888">'
            "no data</text>"
        )
    for n, (name, points) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        path, last_y = [], None
        for t, v in points:  # stepAfter, as the dashboard draws it
            x = px + pw * (t - start) / (end - start)
            y = py + ph - ph * v / top
            if last_y is not None:
                path.append(f"{x:.1f},{last_y:.1f}")
            path.append(f"{x:.1f},{y:.1f}")
            last_y = y
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(path)}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        lx = px + (n % 3) * (pw / 3)
        ly = py + ph + 32 + (n // 3) * 14
        out.append(
            f'<rect x="{lx:.1f}" y="{ly - 8:.1f}" width="10" height="3" fill="{colour}"/>'
            f'<text x="{lx + 14:.1f}" y="{ly - 3:.1f}" font-size="11">{escape(name)}</text>'
        )
    out.append("</g>")
    return out


def render(base: str, dashboard: dict, start: float, end: float, step: float) -> str:
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) * ROW / 8 + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="#f4f5f5"/>',
        (
            '<text x="10" y="24" font-size="16" '
            f'font-weight="bold">{escape(dashboard["title"])}</text>'
        ),
        f'<text x="{WIDTH - 10}" y="24" font-size="11" text-anchor="end">'
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start))} to "
        f"{time.strftime('%H:%M:%S', time.gmtime(end))} UTC, from Prometheus query_range</text>",
    ]
    for panel in panels:
        grid = panel["gridPos"]
        box = (
            grid["x"] * WIDTH / 24 + 4,
            40 + grid["y"] * ROW / 8,
            grid["w"] * WIDTH / 24 - 8,
            grid["h"] * ROW / 8 - 8,
        )
        series = []
        for target in panel["targets"]:
            for result in query_range(base, expanded(target["expr"]), start, end, step):
                points = [(float(t), float(v)) for t, v in result["values"]]
                series.append((legend(target.get("legendFormat", ""), result["metric"]), points))
        out += draw_panel(panel, sorted(series), box, start, end)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prometheus", required=True, help="the server's URL, e.g. http://127.0.0.1:9090"
    )
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--start", type=float, required=True, help="Unix seconds")
    parser.add_argument("--end", type=float, required=True, help="Unix seconds")
    parser.add_argument(
        "--step", type=float, default=0, help="seconds between points (default: the window / 240)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    step = args.step or max((args.end - args.start) / 240, 1.0)
    try:
        svg = render(
            args.prometheus, json.loads(args.dashboard.read_text()), args.start, args.end, step
        )
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        print(f"dashboard_svg: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
