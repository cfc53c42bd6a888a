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


def _importable(*names):
    import importlib.util
    try:
        return all(importlib.util.find_spec(n) is not None for n in names)
    except (ImportError, ValueError):
        return False


@require("kdloss_fused_linear_distill")
@pytest.mark.skipif(not _importable("trl", "transformers", "datasets"),
                    reason="trl (with transformers, datasets) is not installed")
def test_trl_gkd_example_runs_with_trl(monkeypatch, capsys):
    """examples/trl_gkd.py with TRL's GKDTrainer: kdloss's losses in place of
    generalized_jsd_loss / compute_loss, num_items_in_batch passed through."""
    monkeypatch.delenv("KDLOSS_EXAMPLE_NO_TRL", raising=False)
    path, _ = _script("trl_gkd.py")
    env = runpy.run_path(path, run_name="__main__")
    losses = env["losses"]
    assert len(losses) == env["STEPS"] and all(x == x and abs(x) < 1e3 for x in losses)
    seen = env["num_items_seen"]
    assert len(seen) == env["STEPS"] * env["ACCUM"]
    assert all(n is not None and int(n) > 0 for n in seen)
    out = capsys.readouterr().out
    assert "generalized_jsd_loss" in out and "steps, loss" in out


@require("kdloss_fused_linear_distill")
@pytest.mark.skipif(not _importable("transformers"), reason="transformers is not installed")
def test_trl_gkd_example_plain_loop(monkeypatch, capsys):
    """The example's fallback without trl: the same loss in a plain accumulation loop."""
    monkeypatch.setenv("KDLOSS_EXAMPLE_NO_TRL", "1")
    path, _ = _script("trl_gkd.py")
    env = runpy.run_path(path, run_name="__main__")
    losses = env["losses"]
    assert len(losses) == env["STEPS"] and all(x == x and 0 <= x < 1e3 for x in losses)
    assert "steps, loss" in capsys.readouterr().out


@require("kdloss_fused_linear_distill")
@pytest.mark.skipif(not _importable("trl", "transformers", "datasets"),
                    reason="trl (with transformers, datasets) is not installed")
def test_trl_distillation_example_follows_trl(capsys):
    """examples/trl_distillation.py: TRL's DistillationTrainer with kdloss's
    chunked_divergence_loss swapped in by the subclass; its loss curve follows the one with
    TRL's own loss (same weights, seed and completions) within 1e-3, and kdloss made the calls."""
    path, _ = _script("trl_distillation.py")
    env = runpy.run_path(path, run_name="__main__")
    losses, trl_losses = env["losses"], env["trl_losses"]
    assert len(losses) == len(trl_losses) == env["STEPS"]
    assert all(x == x and 0 <= x < 1e3 for x in losses)
    assert max(abs(a - b) for a, b in zip(losses, trl_losses)) <= 1e-3, (losses, trl_losses)
    assert len(env["kdloss_calls"]) >= env["STEPS"] and all(n > 0 for n in env["kdloss_calls"])
    assert "largest difference" in capsys.readouterr().out
