"""Testers pass group ids (``split_groups``) through to the re-identification protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

METRICS = ("precision_at_1", "mean_average_precision")


def _data():
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(20, 4, generator=generator)
    gallery = torch.randn(40, 4, generator=generator)
    query_labels = torch.randint(0, 4, (20,), generator=generator)
    gallery_labels = torch.randint(0, 4, (40,), generator=generator)
    cameras = {
        "query": torch.randint(0, 2, (20,), generator=generator),
        "gallery": torch.randint(0, 2, (40,), generator=generator),
    }
    datasets = {
        "query": torch.utils.data.TensorDataset(query, query_labels),
        "gallery": torch.utils.data.TensorDataset(gallery, gallery_labels),
    }
    return datasets, (query, query_labels, gallery, gallery_labels), cameras


def test_tester_scores_with_the_groups_of_each_split() -> None:
    datasets, (query, query_labels, gallery, gallery_labels), cameras = _data()
    calculator = AccuracyCalculator(include=METRICS, k=None)
    tester = GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        data_device="cpu",
        dataloader_num_workers=0,
        accuracy_calculator=calculator,
        progress_bar=False,
        split_groups=cameras,
    )
    model = torch.nn.Identity()
    found = tester.test(datasets, 0, model, splits_to_eval=[("query", ["gallery"])])
    expected = AccuracyCalculator(include=METRICS, k=None).get_accuracy(
        query,
        query_labels,
        gallery,
        gallery_labels,
        query_groups=cameras["query"],
        reference_groups=cameras["gallery"],
    )
    for name, value in expected.items():
        assert found["query"][f"{name}_level0"] == pytest.approx(value)


def test_missing_split_is_named() -> None:
    datasets, _, cameras = _data()
    tester = GlobalEmbeddingSpaceTester(
        data_device="cpu",
        dataloader_num_workers=0,
        progress_bar=False,
        accuracy_calculator=AccuracyCalculator(include=METRICS),
        split_groups={"query": cameras["query"]},
    )
    with pytest.raises(InvalidArgumentError, match="'split_groups'.*missing \\['gallery'\\]"):
        tester.test(datasets, 0, torch.nn.Identity(), splits_to_eval=[("query", ["gallery"])])


def test_float_groups_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="'split_groups'.*1-D integer group ids"):
        GlobalEmbeddingSpaceTester(split_groups={"query": torch.rand(3)})


def _single_shot_precision_at_1(query, query_labels, gallery, gallery_labels, cameras):
    """The single-shot precision@1 by hand: per query, after the camera rule, the chance
    that a random draw of one candidate per identity puts its identity first."""
    values = []
    for q in range(len(query)):
        distances = ((gallery - query[q]) ** 2).sum(dim=1)
        order = [
            int(j)
            for j in torch.argsort(distances)
            if not (
                gallery_labels[j] == query_labels[q]
                and cameras["gallery"][j] == cameras["query"][q]
            )
        ]
        identities = [int(gallery_labels[j]) for j in order]
        own = int(query_labels[q])
        if own not in identities:
            continue  # left out
        sizes = {i: identities.count(i) for i in set(identities)}
        chance = 0.0
        for position, identity in enumerate(identities):
            if identity == own:
                survive = 1.0
                for other, size in sizes.items():
                    if other != own:
                        survive *= 1 - identities[:position].count(other) / size
                chance += survive / sizes[own]
        values.append(chance)
    return sum(values) / len(values)


def _single_shot_tester(cameras, **options):
    return GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        data_device="cpu",
        dataloader_num_workers=0,
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1", "recall_at_3")),
        progress_bar=False,
        split_groups=cameras,
        single_gallery_shot=True,
        **options,
    )


def test_single_gallery_shot_passes_through_to_the_protocol() -> None:
    datasets, tensors, cameras = _data()
    found = _single_shot_tester(cameras).test(
        datasets, 0, torch.nn.Identity(), splits_to_eval=[("query", ["gallery"])]
    )
    expected = _single_shot_precision_at_1(*tensors, cameras)
    assert found["query"]["precision_at_1_level0"] == pytest.approx(expected, abs=1e-9)
    plain = GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        data_device="cpu",
        dataloader_num_workers=0,
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        progress_bar=False,
        split_groups=cameras,
    ).test(datasets, 0, torch.nn.Identity(), splits_to_eval=[("query", ["gallery"])])
    assert plain["query"]["precision_at_1_level0"] != pytest.approx(expected, abs=1e-9)


def test_single_gallery_shot_draws_pass_through() -> None:
    datasets, (query, query_labels, gallery, gallery_labels), cameras = _data()
    np.random.seed(3)
    found = _single_shot_tester(cameras, single_gallery_shot_draws=4).test(
        datasets, 0, torch.nn.Identity(), splits_to_eval=[("query", ["gallery"])]
    )
    np.random.seed(3)
    expected = AccuracyCalculator(include=("precision_at_1", "recall_at_3")).get_accuracy(
        query, query_labels, gallery, gallery_labels, query_groups=cameras["query"],
        reference_groups=cameras["gallery"], single_gallery_shot=True,
        single_gallery_shot_draws=4,
    )  # fmt: skip
    for name, value in expected.items():
        assert found["query"][f"{name}_level0"] == pytest.approx(value)


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"single_gallery_shot": 1}, TypeError, ["single_gallery_shot"]),
        ({"single_gallery_shot_draws": 3}, ValueError,
         ["single_gallery_shot_draws", "single_gallery_shot=True"]),
        ({"single_gallery_shot": True, "single_gallery_shot_draws": 0}, ValueError,
         ["single_gallery_shot_draws"]),
        ({"single_gallery_shot": True, "single_gallery_shot_draws": 2.5}, TypeError,
         ["single_gallery_shot_draws"]),
        ({"single_gallery_shot": True, "distributed": True}, ValueError,
         ["single_gallery_shot", "distributed"]),
    ],
)  # fmt: skip
def test_bad_single_shot_options_are_refused_when_built(options, error, names) -> None:
    with pytest.raises(error) as caught:
        GlobalEmbeddingSpaceTester(**options)
    for name in names:
        assert name in str(caught.value)
