"""Drawing panels as grey-level images: supersampled with PIL, box-filtered down to the panel size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from PIL import Image, ImageDraw

from .rules import COLOR_LEVELS, SIZE_FRACTIONS, Panel, _check_int

_RENDER_MIN = 160  # DeepMind's release size


@dataclass(frozen=True)
class _Geometry:
    """Drawing coordinates for one render size."""

    size: int
    centres: tuple[tuple[float, float], ...]
    radii: tuple[float, ...]
    unit_polygons: tuple[tuple[tuple[float, float], ...], ...]
    insets: tuple[float, ...]
    outline: int
    line_width: int


@cache
def _geometry(size: int) -> _Geometry:
    """Cell centres, radii, polygon outlines and stroke widths for ``size``-pixel panels."""
    cell = size / 3
    polygons = []
    for sides in (3, 4, 5, 6):
        # Even-sided polygons sit on a flat edge, odd ones point up.
        start = -math.pi / 2 + (math.pi / sides if sides % 2 == 0 else 0.0)
        polygons.append(
            tuple(
                (math.cos(start + 2 * math.pi * k / sides), math.sin(start + 2 * math.pi * k / sides))
                for k in range(sides)
            )
        )
    return _Geometry(
        size=size,
        centres=tuple(((c % 3 + 0.5) * cell, (c // 3 + 0.5) * cell) for c in range(9)),
        radii=tuple(f * cell / 2 for f in SIZE_FRACTIONS),
        unit_polygons=tuple(polygons),
        # The circumradius lost by moving every edge of a regular polygon inwards by 1.
        insets=tuple(1 / math.cos(math.pi / sides) for sides in (3, 4, 5, 6)),
        outline=max(1, round(size / 80)),
        line_width=max(1, round(size / 55)),
    )


def _draw_panel(draw: ImageDraw.ImageDraw, panel: Panel, geometry: _Geometry, left: float = 0.0) -> None:
    """Draw a panel's lines, then its shapes over them, with its left edge at x = ``left``."""
    size, width = geometry.size, geometry.line_width
    near, far, middle = 0.08 * size, 0.92 * size, size / 2
    for line in panel.lines:
        fill = COLOR_LEVELS[line.color]
        if line.type < 4:
            (x0, y0), (x1, y1) = (
                ((near, far), (far, near)),
                ((near, near), (far, far)),
                ((near, middle), (far, middle)),
                ((middle, near), (middle, far)),
            )[line.type]
            draw.line(((left + x0, y0), (left + x1, y1)), fill=fill, width=width)
        else:
            r = (0.22 if line.type == 4 else 0.42) * size
            x = left + middle
            draw.ellipse((x - r, middle - r, x + r, middle + r), outline=fill, width=width)
    outline = geometry.outline
    for shape in panel.shapes:
        x, y = geometry.centres[shape.position]
        x += left
        r = geometry.radii[shape.size]
        fill = COLOR_LEVELS[shape.color]
        # A black shape, then the fill inset by the outline width: PIL's wide polygon outlines are slow.
        if shape.type == 4:
            draw.ellipse((x - r, y - r, x + r, y + r), fill=0)
            inner = r - outline
            draw.ellipse((x - inner, y - inner, x + inner, y + inner), fill=fill)
        else:
            unit, inset = geometry.unit_polygons[shape.type], geometry.insets[shape.type]
            draw.polygon([(x + r * u, y + r * v) for u, v in unit], fill=0)
            inner = r - outline * inset
            draw.polygon([(x + inner * u, y + inner * v) for u, v in unit], fill=fill)


def _render_factor(panel_size: int) -> int:
    """The supersampling factor: panels are drawn at >= 160 pixels and at least twice their size."""
    return max(2, -(-_RENDER_MIN // panel_size))


def render_panel(panel: Panel, panel_size: int = 80) -> np.ndarray:
    """A panel as a (panel_size, panel_size) uint8 image: white background, darker objects."""
    return render_panels([panel], panel_size)[0]


@lru_cache(maxsize=4)
def _render_candidates(candidates: tuple[Panel, ...], panel_size: int) -> np.ndarray:
    """``render_panels`` of a puzzle's candidates, kept for the few puzzles last drawn (read-only)."""
    images = render_panels(candidates, panel_size)
    images.flags.writeable = False
    return images


def render_panels(panels: Sequence[Panel], panel_size: int = 80) -> np.ndarray:
    """Panels as a (len(panels), panel_size, panel_size) uint8 array, drawn side by side on one canvas."""
    panel_size = _check_int("panel_size", panel_size, 16)
    factor = _render_factor(panel_size)
    size = panel_size * factor
    image = Image.new("L", (size * len(panels), size), 255)
    draw = ImageDraw.Draw(image)
    geometry = _geometry(size)
    for i, panel in enumerate(panels):
        _draw_panel(draw, panel, geometry, float(i * size))
    strip = np.asarray(image.reduce(factor))
    return np.ascontiguousarray(strip.reshape(panel_size, len(panels), panel_size).transpose(1, 0, 2))
