"""The worst queries, their retrievals and their picture, against a brute-force ranking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.worst_queries import find_worst_queries, worst_queries_rows


def _data(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (num,), generator=generator)
    x = torch.randn(num, 4, generator=generator, dtype=torch.float64)
    x[:, 0] += 0.8 * labels.double()
    return x, labels


def _brute_force(query, labels, reference, reference_labels, self_search, k_recall):
    """Per query: every reference ranked by squared distance (itself out), recall@K."""
    found = []
    for row in range(len(query)):
        distances = ((reference - query[row]) ** 2).sum(dim=1)
        order = [
            int(i) for i in torch.argsort(distances, stable=True) if not (self_search and i == row)
        ]
        relevant = [bool(reference_labels[i] == labels[row]) for i in order]
        if not any(relevant):
            continue  # lone
        found.append((row, float(any(relevant[:k_recall])), order, relevant, distances))
    return found


@pytest.mark.parametrize("self_search", [True, False])
def test_worst_queries_equal_a_brute_force_ranking(self_search):
    query, labels = _data(80, seed=0)
    reference, reference_labels = (query, labels) if self_search else _data(120, seed=1)
    worst = find_worst_queries(
        query,
        labels,
        None if self_search else reference,
        None if self_search else reference_labels,
        metric="recall_at_2",
        num_queries=6,
        k=3,
    )
    oracle = _brute_force(query, labels, reference, reference_labels, self_search, 2)
    oracle.sort(key=lambda item: item[1])  # stable: ties keep the query order
    assert [w.index for w in worst] == [item[0] for item in oracle[:6]]
    for item, (row, value, order, relevant, distances) in zip(worst, oracle):
        assert item.value == value and item.label == int(labels[row])
        assert [r.index for r in item.retrievals] == order[:3]
        assert [r.relevant for r in item.retrievals] == relevant[:3]
        assert [r.rank for r in item.retrievals] == [1, 2, 3]
        for r in item.retrievals:
            assert r.distance == pytest.approx(float(distances[r.index]), rel=1e-6, abs=1e-9)
        first = relevant.index(True)
        assert item.nearest_relevant.rank == first + 1
        assert item.nearest_relevant.index == order[first]


def test_rows_show_the_nearest_relevant_after_the_top_k_only_when_it_is_further_down():
    query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
    worst = find_worst_queries(query, torch.tensor([0, 0, 1, 1]), num_queries=2, k=2)
    rows = worst_queries_rows(worst)
    # query 1: 2 (other label), 0 (same label, in the top 2); query 2: 1, 0, then 3 at rank 3
    assert [(row[0], row[3], row[4], row[7]) for row in rows] == [
        (1, 1, 2, False),
        (1, 2, 0, True),
        (2, 1, 1, False),
        (2, 2, 0, False),
        (2, 3, 3, True),
    ]


def test_lone_queries_are_never_chosen_and_fewer_may_come_back():
    query = torch.tensor([[0.0], [0.1], [5.0]])
    worst = find_worst_queries(query, torch.tensor([0, 0, 1]), num_queries=10)
    assert [w.index for w in worst] == [0, 1]


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"metric": "NMI"}, InvalidArgumentError, "'metric'"),
        ({"metric": "recall_at_x"}, InvalidArgumentError, "'metric'"),
        ({"num_queries": 0}, InvalidArgumentError, "'num_queries'"),
        ({"k": True}, InvalidTypeError, "'k'"),
    ],
)
def test_bad_options_name_the_argument(kwargs, error, words):
    query, labels = _data(10, seed=2)
    with pytest.raises(error, match=words):
        find_worst_queries(query, labels, **kwargs)


def test_two_dimensional_labels_are_refused():
    query, labels = _data(10, seed=3)
    with pytest.raises(InvalidTypeError, match="'query_labels'"):
        find_worst_queries(query, labels.reshape(-1, 1))


def test_the_picture_is_drawn_from_arrays_and_from_paths(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread, imsave

    from pytorch_metric_learning.plots import plot_worst_queries

    query, labels = _data(30, seed=4)
    arrays = [np.full((8, 8), i / 30) for i in range(30)]
    worst = find_worst_queries(query, labels, num_queries=3, k=4)
    out = plot_worst_queries(worst, tmp_path / "arrays.png", arrays)
    assert imread(out).shape[0] > 200
    paths = []
    for i, array in enumerate(arrays):
        imsave(tmp_path / f"{i}.png", array, cmap="gray")
        paths.append(tmp_path / f"{i}.png")
    chw = [torch.rand(3, 8, 8) for _ in range(30)]
    assert plot_worst_queries(worst, tmp_path / "paths.png", paths).stat().st_size > 0
    assert plot_worst_queries(worst, tmp_path / "chw.png", chw).stat().st_size > 0


def test_the_picture_refuses_too_few_images_and_unreadable_files(tmp_path):
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning.plots import plot_worst_queries

    query, labels = _data(30, seed=5)
    worst = find_worst_queries(query, labels, num_queries=2, k=2)
    with pytest.raises(InvalidArgumentError, match="'query_images'.*at least"):
        plot_worst_queries(worst, tmp_path / "x.png", [np.zeros((4, 4))] * 2)
    missing = [tmp_path / "nope.png"] * 30
    with pytest.raises(InvalidArgumentError, match="nope.png"):
        plot_worst_queries(worst, tmp_path / "x.png", missing)
    assert not (tmp_path / "x.png").exists()


def _drawn_texts(monkeypatch, worst, tmp_path, **kwargs) -> list[str]:
    """Every text of the picture (title, captions), caught as it is saved."""
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning import plots
    from pytorch_metric_learning.plots import plot_worst_queries

    texts: list[str] = []
    real_save = plots._save

    def save(figure, path):
        texts.append(figure.get_suptitle())
        texts.extend(axes.get_title() for axes in figure.axes)
        return real_save(figure, path)

    monkeypatch.setattr(plots, "_save", save)
    images = [np.full((8, 8), 0.5) for _ in range(len(worst) and 40)]
    plot_worst_queries(worst, tmp_path / "w.png", images, **kwargs)
    return texts


@pytest.mark.parametrize("metric", ["recall_at_2", "mean_average_precision_at_r", "r_precision"])
def test_the_queries_carry_their_metric_and_the_plot_and_table_use_it(
    metric, monkeypatch, tmp_path
):
    from pytorch_metric_learning.worst_queries import worst_queries_header

    query, labels = _data(40, seed=5)
    worst = find_worst_queries(query, labels, metric=metric, num_queries=2, k=3)
    assert {(item.metric, item.k) for item in worst} == {(metric, 3)}
    assert worst_queries_header(worst)[2] == metric
    from pytorch_metric_learning.plots import metric_label

    texts = _drawn_texts(monkeypatch, worst, tmp_path)
    assert f"by {metric_label(metric)}" in texts[0]
    assert all(metric_label("precision_at_1") not in text for text in texts)


def test_a_conflicting_metric_is_refused(monkeypatch, tmp_path):
    query, labels = _data(40, seed=5)
    worst = find_worst_queries(query, labels, metric="recall_at_2", num_queries=2, k=3)
    with pytest.raises(InvalidArgumentError, match="'metric'.*'recall_at_2'"):
        _drawn_texts(monkeypatch, worst, tmp_path, metric="precision_at_1")
    assert _drawn_texts(monkeypatch, worst, tmp_path, metric="recall_at_2")


def test_one_worst_query_is_named_in_the_singular(monkeypatch, tmp_path):
    query, labels = _data(40, seed=5)
    worst = find_worst_queries(query, labels, num_queries=1, k=2)
    assert _drawn_texts(monkeypatch, worst, tmp_path)[0].startswith("The worst query by")


@pytest.mark.parametrize(
    "distance, kind",
    [("lp", "distance"), ("cosine", "similarity"), ("dot", "similarity")],
)
def test_similarities_are_labelled_as_similarities(distance, kind, monkeypatch, tmp_path):
    from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN
    from pytorch_metric_learning.worst_queries import worst_queries_header

    made = {"lp": LpDistance, "cosine": CosineSimilarity, "dot": DotProductSimilarity}[distance]
    query, labels = _data(40, seed=6)
    worst = find_worst_queries(query, labels, num_queries=3, k=4, knn_func=CustomKNN(made()))
    assert {item.distance_kind for item in worst} == {kind}
    assert worst_queries_header(worst)[6] == kind
    for item in worst:  # the oracle: similarities fall along the ranking, distances grow
        values = [found.distance for found in item.retrievals]
        assert values == sorted(values, reverse=kind == "similarity")
    texts = _drawn_texts(monkeypatch, worst, tmp_path)
    assert ("s: similarity" if kind == "similarity" else "d: distance") in texts[0]
    symbol = "s = " if kind == "similarity" else "d = "
    assert any(symbol in text for text in texts[1:])


def test_a_backend_that_declares_similarities_is_labelled_so():
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.evaluation import CustomKNN

    exact = CustomKNN(CosineSimilarity())

    def knn(query, k, reference=None, ref_includes_query=False):
        return exact(query, k, reference, ref_includes_query)

    knn.is_inverted = True  # type: ignore[attr-defined]
    query, labels = _data(40, seed=6)
    worst = find_worst_queries(query, labels, num_queries=2, k=3, knn_func=knn)
    assert {item.distance_kind for item in worst} == {"similarity"}


@pytest.mark.parametrize("self_search", [True, False])
def test_numpy_inputs_give_what_tensors_give(self_search):
    query, labels = _data(30, seed=7)
    reference, reference_labels = (None, None) if self_search else _data(25, seed=8)
    from_tensors = find_worst_queries(query, labels, reference, reference_labels, num_queries=4)
    from_arrays = find_worst_queries(
        query.numpy(),
        labels.numpy(),
        None if reference is None else reference.numpy(),
        None if reference_labels is None else reference_labels.numpy(),
        num_queries=4,
    )
    assert from_arrays == from_tensors


@pytest.mark.parametrize(
    "args, param",
    [
        ((np.zeros(3),), "'query'"),
        ((["a"],), "'query'"),
        ((np.zeros((4, 2)), np.array(["a", "b", "c", "d"], dtype=object)), "'query_labels'"),
        ((np.zeros((4, 2)), [0, 1, 0, 1]), "'query_labels'"),
        ((np.zeros((4, 2)), np.arange(3)), "'query_labels'"),
    ],
)
def test_bad_inputs_are_named_for_find_worst_queries(args, param):
    args = args if len(args) == 2 else (*args, np.arange(3))
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match=param) as caught:
        find_worst_queries(*args)
    assert "find_worst_queries" in str(caught.value)


def _few_worst():
    query, labels = _data(40, seed=9)
    return find_worst_queries(query, labels, num_queries=2, k=3)


@pytest.mark.parametrize(
    "bad, words",
    [
        (np.full((8, 8), 2.0), "values from 2 to 2"),
        (np.full((8, 8), -0.5), "values from -0.5"),
        (np.full((8, 8), np.nan), "NaN"),
        (np.full((8, 8, 3), 255.0, dtype=np.float32), "values from 255"),
        (np.full((8, 8), -3, dtype=np.int16), "int16"),
    ],
)
def test_images_outside_the_drawable_range_are_refused(bad, words, tmp_path):
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning.plots import plot_worst_queries

    images = [np.full((8, 8), 0.5)] * 40
    images[_few_worst()[0].index] = bad
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="'images'") as caught:
        plot_worst_queries(_few_worst(), tmp_path / "w.png", images)
    assert words in str(caught.value)
    assert not (tmp_path / "w.png").exists()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.bool_])
def test_unsigned_images_are_scaled_by_their_range(dtype, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from pytorch_metric_learning.plots import plot_worst_queries

    top = 1 if dtype is np.bool_ else np.iinfo(dtype).max
    images = [np.full((16, 16), top, dtype=dtype)] * 40  # white tiles, as uint8 255 draws them
    white = plot_worst_queries(_few_worst(), tmp_path / "a.png", images)
    expected = plot_worst_queries(
        _few_worst(), tmp_path / "b.png", [np.full((16, 16), 255, dtype=np.uint8)] * 40
    )
    assert np.array_equal(imread(white), imread(expected))


def test_label_names_too_short_and_other_extensions_are_refused(tmp_path):
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning.plots import plot_worst_queries

    images = [np.full((8, 8), 0.5)] * 40
    with pytest.raises(InvalidArgumentError, match="'label_names'.*names.*2 names"):
        plot_worst_queries(_few_worst(), tmp_path / "w.png", images, label_names=["a", "b"])
    for name in ("w.jpg", "w.pdf", "w"):
        with pytest.raises(InvalidArgumentError, match="'path'.*\\.png"):
            plot_worst_queries(_few_worst(), tmp_path / name, images)
        assert not (tmp_path / name).exists()


def test_long_label_names_are_cut_to_the_tile(monkeypatch, tmp_path):
    names = [f"a very long class name number {i} with more words\nand a line" for i in range(5)]
    texts = _drawn_texts(monkeypatch, _few_worst(), tmp_path, label_names=names)
    for caption in texts[1:]:
        assert all(len(line) <= 28 for line in caption.splitlines()), caption
    assert any("…" in caption for caption in texts[1:])
