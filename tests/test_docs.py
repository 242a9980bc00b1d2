"""Every ```python block of README.md and of each docs page runs, in order, in a fresh
interpreter (so the docs cannot drift from the API); a page's blocks share one namespace, as a
reader running them would."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(page: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def test_every_tutorial_and_the_readme_have_code():
    counts = {p.relative_to(ROOT).as_posix(): len(python_blocks(p)) for p in PAGES}
    assert counts["README.md"] >= 1
    assert all(counts[p] >= 1 for p in counts if p.startswith("docs/tutorials/")), counts
    assert len([p for p in counts if p.startswith("docs/tutorials/")]) >= 6, counts


# Pages whose code trains for a while: run in CI's slow stage (`pytest -m slow`).
SLOW_PAGES = {
    "docs/tutorials/bayesian_optimisation.md",
    "docs/tutorials/force_fields.md",
    "docs/tutorials/hyperparameters.md",
    "docs/tutorials/large_scale.md",
    "docs/tutorials/observations.md",
}


def _param(page):
    name = page.relative_to(ROOT).as_posix()
    return pytest.param(page, id=name, marks=[pytest.mark.slow] if name in SLOW_PAGES else [])


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if python_blocks(p)])
def test_python_blocks_run(page, tmp_path):
    code = "\n\n".join(python_blocks(page))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
