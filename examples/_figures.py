"""Plot helpers shared by the examples: side-by-side maps on one colour scale, and saving."""

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def maps(grid, panels, suptitle: str, xlabel: str = "$x_1$", ylabel: str = "$x_2$"):
    """One row of filled-contour maps `(title, Z)` over `grid` x `grid`, all on the colour
    scale of the first (the truth), with one shared colour bar. Returns (fig, axes)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6), constrained_layout=True)
    Z0 = np.asarray(panels[0][1])
    levels = np.linspace(Z0.min(), Z0.max(), 31)
    for ax, (title, Z) in zip(axes, panels):
        # Values beyond the truth's range are drawn in the end colours (extend="both").
        cs = ax.contourf(grid, grid, np.asarray(Z), levels=levels, extend="both")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_aspect("equal")
    axes[0].set_ylabel(ylabel)
    fig.colorbar(cs, ax=list(axes), shrink=0.9, label="f")
    fig.suptitle(suptitle)
    return fig, axes


def save(fig, script: str, name: str) -> None:
    out = pathlib.Path(script).with_name(name)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}")
