"""The titles of the figures that ``pytorch_metric_learning.plots`` saves, for tests that
check what a picture says."""

from __future__ import annotations

import pytest


def record_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each saved figure's title (its suptitle) in the returned list."""
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning import plots

    titles: list[str] = []
    real_save = plots._save

    def save(figure, path):
        titles.append(figure.get_suptitle())
        return real_save(figure, path)

    monkeypatch.setattr(plots, "_save", save)
    return titles
