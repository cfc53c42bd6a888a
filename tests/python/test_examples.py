"""The README's examples run, and the README shows the code that runs (examples/*.py)."""

import os
import re
import runpy

import pytest

from conftest import require

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)


def _readme_block(heading):
    """The first ```python block of README.md's section `heading`."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _script(name):
    path = os.path.join(ROOT, "examples", name)
    with open(path) as f:
        return path, f.read().split('"""', 2)[2].strip() + "\n"  # the code after the docstring


def test_readme_shows_the_topk_example():
    _, code = _script("topk_offline.py")
    assert _readme_block("Offline distillation from a stored top-k teacher") == code


@require("kdloss_fused_linear_topk_distill")
def test_topk_example_runs_and_learns(tmp_path, monkeypatch, capsys):
    path, _ = _script("topk_offline.py")
    monkeypatch.chdir(tmp_path)  # it writes teacher_topk.pt into the working directory
    env = runpy.run_path(path, run_name="__main__")
    assert (tmp_path / "teacher_topk.pt").exists()
    losses = env["losses"]
    assert len(losses) == 20 and all(map(lambda x: x == x and abs(x) < 1e3, losses))
    assert losses[-1] < losses[0]
    assert "loss" in capsys.readouterr().out
