"""One single-shot draw gives 0/1 outcomes: every view names it in the singular and says
the values are outcomes of the draw, not chances (the wording for several draws would be
false: "mean of 1 draws", "not a 0/1 outcome").

The oracle is the plain wording written out here and the values themselves (each 0 or 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from _plot_titles import record_titles
from pytorch_metric_learning.cli._breakdowns import render_worst, worst_record
from pytorch_metric_learning.worst_queries import (
    find_worst_queries,
    worst_queries_header,
    worst_queries_note,
)


def _worst(draws: int, metric: str = "precision_at_1"):
    generator = torch.Generator().manual_seed(11)
    ids = torch.arange(36) % 6
    x = torch.randn(36, 3, generator=generator, dtype=torch.float64) + 0.6 * ids[:, None]
    cams = (torch.arange(36) // 6) % 2
    np.random.seed(0)
    return find_worst_queries(
        x,
        ids,
        metric=metric,
        num_queries=6,
        k=3,
        query_groups=cams,
        single_gallery_shot=True,
        single_gallery_shot_draws=draws,
    )


@pytest.mark.parametrize("metric", ["precision_at_1", "recall_at_2"])
def test_one_draw_is_named_in_the_singular_with_a_fitting_note(metric):
    worst = _worst(1, metric)
    assert {item.value for item in worst} <= {0.0, 1.0}
    header = worst_queries_header(worst)
    assert header[2] == f"{metric} (one single-shot draw)"
    note = worst_queries_note(worst)
    assert "0/1 outcome of one random draw" in note
    assert "not a 0/1 outcome" not in note and "[0, 1]" not in note
    table = render_worst(worst, metric, None)
    assert "draws)" not in table and "mean of 1" not in table
    record = json.loads(json.dumps(worst_record(worst, metric, None, 3)))
    assert record["value_name"] == f"{metric} (one single-shot draw)"
    assert record["single_shot_draws"] == 1


def test_several_draws_keep_the_plural_wording():
    worst = _worst(2)
    assert worst_queries_header(worst)[2] == "precision_at_1 (mean of 2 single-shot draws)"
    assert "not a 0/1 outcome" in worst_queries_note(worst)


def test_the_picture_of_one_draw_says_outcomes(monkeypatch, tmp_path):
    titles = record_titles(monkeypatch)
    from pytorch_metric_learning.plots import plot_worst_queries

    images = [np.full((4, 4), 0.5) for _ in range(36)]
    plot_worst_queries(_worst(1), tmp_path / "w.png", images)
    assert "(one single-shot draw)" in titles[0]
    assert "0/1 outcomes of one random draw" in titles[0]
    assert "not 0/1 outcomes" not in titles[0] and "draws)" not in titles[0]
