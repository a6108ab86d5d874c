"""Draw grid states as PIL images for ``render_mode: vision`` (no fonts, so it renders the same everywhere)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PIL import Image, ImageDraw

RGB = tuple[int, int, int]
#: A cell's look: (background colour, shape or None, shape colour); shapes: "circle", "square", "ring", "cross".
CellStyle = tuple[RGB, str | None, RGB]


def draw_grid(
    cells: Sequence[Sequence[str]], styles: Mapping[str, CellStyle], cell_size: int = 32
) -> Image.Image:
    """One square per cell, styled by the cell's text symbol; thin grid lines keep cells countable."""
    rows, cols = len(cells), len(cells[0])
    img = Image.new("RGB", (cols * cell_size, rows * cell_size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    pad = max(2, cell_size // 6)
    for r, row in enumerate(cells):
        for c, sym in enumerate(row):
            bg, shape, fg = styles[sym]
            x0, y0 = c * cell_size, r * cell_size
            x1, y1 = x0 + cell_size - 1, y0 + cell_size - 1
            draw.rectangle([x0, y0, x1, y1], fill=bg, outline=(60, 60, 60))
            box = [x0 + pad, y0 + pad, x1 - pad, y1 - pad]
            if shape == "circle":
                draw.ellipse(box, fill=fg)
            elif shape == "square":
                draw.rectangle(box, fill=fg, outline=(40, 40, 40))
            elif shape == "ring":
                draw.ellipse(box, outline=fg, width=max(2, cell_size // 10))
            elif shape == "cross":
                w = max(2, cell_size // 10)
                draw.line([box[0], box[1], box[2], box[3]], fill=fg, width=w)
                draw.line([box[0], box[3], box[2], box[1]], fill=fg, width=w)
    return img
