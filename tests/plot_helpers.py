"""Checks of a drawn matplotlib figure, read from its objects: every title and axis label
inside the canvas (not cut off), legends clear of the data."""

from __future__ import annotations

from typing import Any

from matplotlib.transforms import Bbox


def drawn(fig: Any) -> Any:
    """Draw ``fig`` on its canvas and return the renderer (extents are final after it)."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def assert_texts_inside(fig: Any) -> None:
    """The suptitle, each panel's title and axis labels lie wholly inside the canvas, and
    every visible panel has both axis labels."""
    r = drawn(fig)
    canvas = fig.bbox
    texts = [t for t in (getattr(fig, "_suptitle", None),) if t is not None]
    for ax in fig.axes:
        if not ax.axison:
            continue
        assert ax.get_xlabel() and ax.get_ylabel(), f"panel {ax.get_title()!r} lacks a label"
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
    for t in texts:
        if not t.get_text():
            continue
        e = t.get_window_extent(r)
        assert (
            e.x0 >= canvas.x0 - 1
            and e.x1 <= canvas.x1 + 1
            and e.y0 >= canvas.y0 - 1
            and e.y1 <= canvas.y1 + 1
        ), f"{t.get_text()[:60]!r} is cut off: {e} outside {canvas}"


def legends(fig: Any) -> list[Any]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def point_boxes(fig: Any) -> list[Bbox]:
    """A box around each drawn data point (marker size, at least 2 px) of every line."""
    boxes = []
    for ax in fig.axes:
        for line in ax.get_lines():
            xy = ax.transData.transform(line.get_xydata())
            half = max(1.0, line.get_markersize() * fig.dpi / 72 / 2)
            boxes += [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in xy]
    return boxes


def assert_legends_off_the_data(fig: Any, *, off_the_axes: bool = True) -> None:
    """Every legend inside the canvas, covering no data point; with ``off_the_axes``, no
    legend overlaps any panel at all."""
    r = drawn(fig)
    found = legends(fig)
    assert found, "the figure has no legend"
    for leg in found:
        e = leg.get_window_extent(r)
        assert e.x0 >= -1 and e.y0 >= -1 and e.x1 <= fig.bbox.x1 + 1 and e.y1 <= fig.bbox.y1 + 1
        hit = [b for b in point_boxes(fig) if e.overlaps(b)]
        assert not hit, f"the legend covers {len(hit)} data points"
        if off_the_axes:
            for ax in fig.axes:
                if ax.axison:
                    assert not e.overlaps(ax.get_window_extent(r)), "a legend lies on a panel"
