"""Under single-gallery-shot the worst queries' values are expectations over the draws (in
[0, 1], not 0/1 outcomes): every view (text table, JSON, picture title) says so, and the
ranks and relevance shown let a reader recompute each value.

The oracle is the plain wording each view must carry, written out here, and the expectation
over the draws recomputed by hand from the rows the table shows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from _plot_titles import record_titles
from pytorch_metric_learning.cli._breakdowns import render_worst, worst_record
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.worst_queries import (
    find_worst_queries,
    worst_queries_header,
    worst_queries_rows,
)

EXPECTED = "expected over single-shot draws"
DRAWS = 7
DRAWN = f"mean of {DRAWS} single-shot draws"
# mode -> (protocol arguments, value_kind, what the values are called, draws)
MODES = {
    "off": ({}, "per_query", None, None),
    "expected": ({"single_gallery_shot": True}, "single_shot_expected", EXPECTED, None),
    "drawn": (
        {"single_gallery_shot": True, "single_gallery_shot_draws": DRAWS},
        "single_shot_drawn",
        DRAWN,
        DRAWS,
    ),
}
# metrics whose values single-gallery-shot changes, and one it leaves over every candidate
SINGLE_SHOT_METRICS = ("precision_at_1", "recall_at_2")
METRICS = (*SINGLE_SHOT_METRICS, "mean_average_precision")
VIEWS = ("table", "json", "picture")


def _data():
    """Six identities, two cameras, no ties: a query's camera-mates of its identity are
    not candidates, and identities have several candidates (so the draws matter)."""
    generator = torch.Generator().manual_seed(11)
    ids = torch.arange(36) % 6
    x = torch.randn(36, 3, generator=generator, dtype=torch.float64) + 0.6 * ids[:, None]
    cams = (torch.arange(36) // 6) % 2
    return x, ids, cams


def _worst(mode: str, metric: str, k: int = 3):
    x, ids, cams = _data()
    protocol = dict(MODES[mode][0])
    np.random.seed(0)
    return find_worst_queries(
        x, ids, metric=metric, num_queries=3, k=k, query_groups=cams, **protocol
    )


def _named(mode: str, metric: str) -> str | None:
    """What the values must be called: the metric, plus the single-shot wording where
    single-gallery-shot changes that metric."""
    wording = MODES[mode][2]
    if wording is None or metric not in SINGLE_SHOT_METRICS:
        return None
    return f"{metric} ({wording})"


def _view_texts(view: str, worst, monkeypatch, tmp_path) -> dict[str, object]:
    """What a reader of ``view`` sees: its heading (title, or the value column's name) and
    the words that say what the values and ranks are."""
    if view == "table":
        text = render_worst(worst, worst[0].metric, None)
        lines = text.splitlines()
        return {"title": lines[0], "header": lines[1], "whole": text}
    if view == "json":
        record = json.loads(json.dumps(worst_record(worst, worst[0].metric, None, worst[0].k)))
        return {"record": record}
    texts = record_titles(monkeypatch)
    from pytorch_metric_learning.plots import plot_worst_queries

    images = [np.full((4, 4), 0.5) for _ in range(36)]
    plot_worst_queries(worst, tmp_path / "w.png", images)
    return {"title": texts[0]}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("metric", METRICS)
def test_every_view_says_what_the_values_are(view, mode, metric, monkeypatch, tmp_path):
    worst = _worst(mode, metric)
    assert worst, "the data must have worst queries"
    named = _named(mode, metric)
    kind = MODES[mode][1] if named is not None else "per_query"
    draws = MODES[mode][3] if named is not None else None
    assert {(item.value_kind, item.single_shot_draws) for item in worst} == {(kind, draws)}
    seen = _view_texts(view, worst, monkeypatch, tmp_path)
    if view == "table":
        column = named or metric
        assert seen["title"].startswith(f"The 3 worst queries by {column}")
        assert seen["header"].split("  ")[0:1] == ["query"]
        assert column in seen["header"]
        if named is None:
            assert "single-shot" not in seen["whole"] and "Single gallery shot" not in seen["whole"]
            assert "rank (all candidates)" not in seen["header"]
        else:
            assert "rank (all candidates)" in seen["header"]
            assert "not a 0/1 outcome" in seen["whole"]
            wording = (
                "the exact expectation over the random draws"
                if mode == "expected"
                else f"the mean over {DRAWS} random draws"
            )
            assert wording in seen["whole"]
    elif view == "json":
        record = seen["record"]
        assert record["metric"] == metric
        assert record["value_kind"] == kind
        assert record["value_name"] == (named or metric)
        assert record["single_shot_draws"] == draws
        assert record["rank"] == ("rank" if named is None else "rank (all candidates)")
        assert (record["note"] is None) == (named is None)
        assert {query["value_kind"] for query in record["queries"]} == {kind}
    else:
        from pytorch_metric_learning.plots import metric_label

        title = seen["title"]
        assert title.startswith(f"The 3 worst queries by {metric_label(metric)}")
        if named is None:
            assert "single-shot" not in title and "0/1" not in title
        else:
            assert f"({MODES[mode][2]})" in title
            assert "not 0/1 outcomes" in title
            assert "among every candidate" in title


def test_the_single_shot_data_has_values_that_are_not_outcomes():
    """The case matters: values strictly between 0 and 1 occur, and a query whose
    nearest candidate is relevant can still be among the worst."""
    worst = _worst("expected", "precision_at_1", k=1)
    values = [item.value for item in worst]
    assert all(0.0 <= value <= 1.0 for value in values)
    assert any(0.0 < value < 1.0 for value in values)


def _expected_rank_1(identities: list, own) -> float:
    """P(the query's identity comes first when one candidate per identity is drawn
    uniformly), from the identities of every candidate in ranked order, by enumeration of
    the query identity's position: each other identity must be drawn behind it."""
    sizes = {identity: identities.count(identity) for identity in set(identities)}
    chance = 0.0
    for position, identity in enumerate(identities):
        if identity != own:
            continue
        survive = 1.0
        for other, size in sizes.items():
            if other != own:
                survive *= 1.0 - identities[:position].count(other) / size
        chance += survive / sizes[own]
    return chance


def test_a_reader_can_recompute_each_value_from_the_rows_shown():
    """With k as large as the candidates, the table's rows (ranks over every candidate,
    labels, relevance) are enough to recompute each single-shot value by hand."""
    worst = _worst("expected", "precision_at_1", k=36)
    header = worst_queries_header(worst)
    assert header[3] == "rank (all candidates)"
    rows = worst_queries_rows(worst)
    for item in worst:
        shown = [row for row in rows if row[0] == item.index]
        assert [row[3] for row in shown] == list(range(1, len(shown) + 1))
        identities = [row[5] for row in shown]
        assert [row[7] for row in shown] == [label == item.label for label in identities]
        assert shown[0][2] == pytest.approx(_expected_rank_1(identities, item.label), abs=1e-12)


def test_mixed_value_kinds_are_refused():
    plain = _worst("off", "precision_at_1")
    single = _worst("expected", "precision_at_1")
    with pytest.raises(InvalidArgumentError, match="values are of different kinds"):
        worst_queries_header([plain[0], single[0]])


@pytest.mark.parametrize("single_shot", [False, True])
def test_the_command_line_table_and_json_say_what_the_values_are(capsys, tmp_path, single_shot):
    from pytorch_metric_learning.cli import main

    x, ids, cams = _data()
    for name, array in (("x", x.numpy()), ("ids", ids.numpy()), ("cams", cams.numpy())):
        np.save(tmp_path / f"{name}.npy", array)
    out = tmp_path / "out.json"
    extra = ["--single-gallery-shot"] if single_shot else []
    code = main(
        [
            "evaluate", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "ids.npy"),
            "--query-groups", str(tmp_path / "cams.npy"), "--show-worst", "3",
            "--worst-k", "2", "--output", str(out), *extra,
        ]
    )  # fmt: skip
    result = capsys.readouterr()
    assert code == 0, result.err
    record = json.loads(out.read_text())["worst_queries"]
    named = f"precision_at_1 ({EXPECTED})" if single_shot else "precision_at_1"
    assert f"The 3 worst queries by {named}" in result.out
    assert record["value_name"] == named
    assert record["value_kind"] == ("single_shot_expected" if single_shot else "per_query")
    assert ("rank (all candidates)" in result.out) == single_shot
