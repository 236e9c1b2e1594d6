"""The machinery every tester shares: embed dataset splits, then score queries."""

from __future__ import annotations

import logging
import numbers
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from .._validation import check_positive_int, float_if_integer, invalid
from ..errors import InvalidArgumentError, InvalidTypeError
from ..evaluation import AccuracyCalculator
from ..evaluation.distributed import DistributedAccuracyCalculator
from ..evaluation.retrieval._protocol import group_ids
from ..utils._training_helpers import return_input
from . import _options as opts
from ._batches import batch_labels, unpack_batch
from ._distributed import TesterGroup
from ._pca import PCAProjection, fit_pca
from ._scored_pair import ScoredPair
from ._splits import resolve_splits_to_eval, splits_to_embed
from ._store import EmbeddingStore
from .label_mapper import LabelMapper

__all__ = ["BaseTester"]

logger = logging.getLogger(__name__)

EmbeddingsAndLabels = dict[str, tuple[torch.Tensor, torch.Tensor]]
Model = Callable[[Any], torch.Tensor]


class BaseTester:
    """Embeds dataset splits with a model and scores each query split against references.

    Subclasses decide how one label level is scored (:meth:`score_level`); this class
    does the rest: one forward pass per split (model in ``eval()`` mode, no gradients,
    previous train/eval modes restored), the ``splits_to_eval`` plan, PCA and
    normalization, metric keys, the visualizer and the end-of-testing hook.

    Args:
        normalize_embeddings: L2-normalize embeddings before retrieval.
        use_trunk_output: Evaluate the trunk's output, skipping the embedder.
        batch_size: Batch size of the embedding forward pass.
        dataloader_num_workers: DataLoader worker processes.
        pca: If an int N, standardize then project to N dimensions before normalization.
            The projection is fitted on the reference of each evaluation and applied to
            its query and reference; every metric key gets the suffix ``_pcaN``.
        data_device: Where batches go for the forward pass; None picks CUDA when it is
            available, else the CPU. The models must already be there.
        dtype: If set, floating-point inputs are cast to it for the forward pass (e.g.
            ``torch.float16`` with a ``model.half()``); embeddings keep the output's dtype.
        data_and_label_getter: Splits a batch into ``(data, labels)``; None means the
            batch already is that pair.
        label_hierarchy_level: Which label column to evaluate: an int, a list of ints, or
            "all". Several levels add ``AVERAGE_<metric>`` keys.
        end_of_testing_hook: Called as ``hook(tester)`` once, after every split is
            evaluated, while ``tester.embeddings_and_labels`` still holds the embeddings.
        dataset_labels: Every label of the dataset, for ``set_min_label_to_zero``.
        set_min_label_to_zero: Remap labels (also strings) to consecutive ints by rank,
            with a :class:`LabelMapper` built from ``dataset_labels``.
        accuracy_calculator: Computes the metrics; None means ``AccuracyCalculator()``.
        visualizer: An object with ``fit_transform`` (e.g. ``umap.UMAP()``), run on each
            query split's embeddings.
        visualizer_hook: Called as ``hook(visualizer, points, labels, split_name, keyname,
            epoch)`` with the visualizer's output, once per label level.
        embeddings_device: Where the embeddings are stored and scored; None means
            ``data_device``. Use ``"cpu"`` when the evaluation set does not fit in GPU memory.
        progress_bar: Show a tqdm progress bar over the batches of each split.
        distributed: Share the work among the ranks of a ``torch.distributed`` process
            group (e.g. under DistributedDataParallel). Every rank calls :meth:`test` with
            the whole datasets; each embeds its share of every split, and every rank gets
            the ``all_accuracies`` a single process would get. ``accuracy_calculator`` must
            then be None (a default
            :class:`~pytorch_metric_learning.evaluation.distributed.DistributedAccuracyCalculator`)
            or a DistributedAccuracyCalculator, whose ``group`` and ``timeout`` the tester
            uses too. ``embeddings_and_labels`` holds this rank's rows, in the hook too.
        split_groups: ``{split name: group ids}``, one integer id (e.g. a camera id) per
            item of the split's dataset, in dataset order: passed to ``get_accuracy`` as
            ``query_groups``/``reference_groups`` (joined like the reference splits), so a
            reference with the query's label and group is not a candidate (the
            re-identification protocol, docs/protocols.md). Not with ``distributed``.
        single_gallery_shot: Score with ``get_accuracy(..., single_gallery_shot=True)``:
            torchreid's CUHK03 single-gallery-shot CMC (docs/protocols.md). Not with
            ``distributed``.
        single_gallery_shot_draws: With ``single_gallery_shot``, passed as
            ``single_gallery_shot_draws`` (random draws instead of the exact expectation).

    Example:
        >>> tester = BaseTester(batch_size=64, data_device="cpu")
        >>> tester.batch_size, tester.normalize_embeddings, tester.label_hierarchy_level
        (64, True, 0)
    """

    def __init__(
        self,
        normalize_embeddings: bool = True,
        use_trunk_output: bool = False,
        batch_size: int = 32,
        dataloader_num_workers: int = 2,
        pca: int | None = None,
        data_device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        data_and_label_getter: Callable[[Any], Any] | None = None,
        label_hierarchy_level: int | str | Sequence[int] = 0,
        end_of_testing_hook: Callable[[BaseTester], Any] | None = None,
        dataset_labels: Any = None,
        set_min_label_to_zero: bool = False,
        accuracy_calculator: Any = None,
        visualizer: Any = None,
        visualizer_hook: Callable[..., Any] | None = None,
        *,
        embeddings_device: torch.device | str | None = None,
        progress_bar: bool = True,
        distributed: bool = False,
        split_groups: Mapping[str, Any] | None = None,
        single_gallery_shot: bool = False,
        single_gallery_shot_draws: int | None = None,
    ) -> None:
        owner = type(self).__name__
        self.normalize_embeddings = opts.check_bool(
            normalize_embeddings, "normalize_embeddings", owner
        )
        self.use_trunk_output = opts.check_bool(use_trunk_output, "use_trunk_output", owner)
        self.batch_size = check_positive_int(batch_size, "batch_size", owner)
        self.dataloader_num_workers = opts.check_non_negative_int(
            dataloader_num_workers, "dataloader_num_workers", owner
        )
        self.pca = None if pca is None else check_positive_int(pca, "pca", owner)
        self.data_device = opts.check_device(data_device, "data_device", owner) or _default_device()
        self.dtype = opts.check_dtype(dtype, "dtype", owner)
        # None: the batch already is (data, labels); 2.x's default, return_input, as here.
        self.data_and_label_getter = (
            opts.check_callable(data_and_label_getter, "data_and_label_getter", owner)
            or return_input
        )
        self.label_hierarchy_level = opts.check_label_hierarchy_level(label_hierarchy_level, owner)
        self.end_of_testing_hook = opts.check_callable(
            end_of_testing_hook, "end_of_testing_hook", owner
        )
        self.dataset_labels = dataset_labels
        self.set_min_label_to_zero = opts.check_bool(
            set_min_label_to_zero, "set_min_label_to_zero", owner
        )
        self.label_mapper = LabelMapper(set_min_label_to_zero, dataset_labels)
        self.distributed = opts.check_bool(distributed, "distributed", owner)
        self.accuracy_calculator = _accuracy_calculator(accuracy_calculator, distributed, owner)
        opts.check_visualizer(visualizer, visualizer_hook, owner)
        self.visualizer = visualizer
        self.visualizer_hook = visualizer_hook
        self.embeddings_device = (
            opts.check_device(embeddings_device, "embeddings_device", owner) or self.data_device
        )
        self.progress_bar = opts.check_bool(progress_bar, "progress_bar", owner)
        self.split_groups = _check_split_groups(split_groups, self.distributed, owner)
        self.single_gallery_shot, self.single_gallery_shot_draws = _check_single_shot(
            single_gallery_shot, single_gallery_shot_draws, self.distributed, owner
        )
        self._check_protocol_allowed()
        # a defaultdict(dict), as in 2.x: code may write all_accuracies[split][key] = value
        self.all_accuracies: dict[str, dict[str, Any]] = defaultdict(dict)

    # ------------------------------------------------------------------ public API

    def test(
        self,
        dataset_dict: Mapping[str, Any],
        epoch: int,
        trunk_model: Model,
        embedder_model: Model | None = None,
        splits_to_eval: Sequence[tuple[str, Sequence[str]]] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Embed the splits, score every query split, and return ``all_accuracies``.

        Args:
            dataset_dict: Split name -> dataset whose items are ``(data, label)``.
            epoch: Stored as ``all_accuracies[split]["epoch"]`` for logging and history;
                it never changes a computation.
            trunk_model: The model (any callable; ``nn.Module`` modes are handled).
            embedder_model: Applied to the trunk's output; None is the identity.
            splits_to_eval: ``[(query_split, [reference_splits]), ...]``; None makes every
                split query itself. A query split may appear once; the query is moved to
                the front of its references when it is one of them.
            collate_fn: Passed to the DataLoader.

        Returns:
            ``{split: {"epoch": epoch, "<metric>_level<L>[_pca<N>]": value, ...}}`` (a
            ``defaultdict(dict)``, as in 2.x), also stored as ``self.all_accuracies``;
            with ``distributed``, the same on every rank.

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> data = torch.tensor([[0.0, 1.0], [0.1, 1.0], [1.0, 0.0], [1.0, 0.1]])
            >>> val = TensorDataset(data, torch.tensor([0, 0, 1, 1]))
            >>> tester = GlobalEmbeddingSpaceTester(
            ...     accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
            ...     dataloader_num_workers=0, data_device="cpu", progress_bar=False)
            >>> dict(tester.test({"val": val}, epoch=1, trunk_model=torch.nn.Identity()))
            {'val': {'epoch': 1, 'precision_at_1_level0': 1.0}}
        """
        plan = resolve_splits_to_eval(
            splits_to_eval, _check_dataset_dict(dataset_dict), self._owner
        )
        self._check_plan(plan)
        self._check_protocol_allowed()  # the calculator may have been replaced since
        self._check_groups_cover(plan, dataset_dict)
        logger.info("Evaluating epoch %s", epoch)
        embedder = _identity if embedder_model is None else embedder_model
        self.embeddings_and_labels = self._embed_splits(
            dataset_dict, splits_to_embed(plan), trunk_model, embedder, collate_fn
        )
        try:
            self.all_accuracies = defaultdict(dict)
            for query_split_name, reference_split_names in plan:
                accuracies = self._evaluate(query_split_name, reference_split_names, epoch)
                self.all_accuracies[query_split_name] = accuracies
            self._end_of_testing(epoch)
        finally:
            del self.embeddings_and_labels
        return self.all_accuracies

    def get_all_embeddings(
        self,
        dataset: Any,
        trunk_model: Model,
        embedder_model: Model | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        eval: bool = True,
        return_as_numpy: bool = False,
    ) -> tuple[Any, Any]:
        """Embed one dataset, e.g. to export embeddings for t-SNE or UMAP.

        The models are put in ``eval()`` mode (their previous modes are restored; with
        ``eval=False`` their modes are left as they are) and run without gradients. The embeddings are processed as for an evaluation of the
        dataset against itself: with ``pca``, projected by a PCA fitted on them, then
        normalized when ``normalize_embeddings`` is set. With ``distributed``, every rank
        embeds its share and gets the embeddings of the whole dataset.

        Returns:
            ``(embeddings, labels)`` on ``embeddings_device``; labels are 2-D,
            ``(len(dataset), num_label_levels)``. NumPy arrays with ``return_as_numpy``.

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> dataset = TensorDataset(torch.randn(6, 5), torch.tensor([0, 0, 1, 1, 2, 2]))
            >>> tester = GlobalEmbeddingSpaceTester(
            ...     dataloader_num_workers=0, data_device="cpu", progress_bar=False)
            >>> embeddings, labels = tester.get_all_embeddings(dataset, torch.nn.Linear(5, 2))
            >>> embeddings.shape, labels.shape
            (torch.Size([6, 2]), torch.Size([6, 1]))
        """
        embedder = _identity if embedder_model is None else embedder_model
        with _eval_mode(trunk_model, embedder) if eval else nullcontext():
            embeddings, labels = self._embed(dataset, "dataset", trunk_model, embedder, collate_fn)
        if self.pca is not None:
            projection = self._fit_pca(self._pca_rows(embeddings, labels), self.pca)
            embeddings = self._normalize(projection.transform(embeddings))
        group = self._process_group()
        if group is not None:
            embeddings, labels = group.gather(embeddings, labels, "gathering the embeddings")
        if return_as_numpy:
            return embeddings.cpu().numpy(), labels.cpu().numpy()
        return embeddings, labels

    def set_reference_and_query(
        self,
        embeddings_and_labels: EmbeddingsAndLabels,
        query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(query, query_labels, reference, reference_labels)`` of one evaluation.

        The reference is the concatenation of the reference splits, in the given order.

        Example:
            >>> import torch
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> stored = {
            ...     "test": (torch.ones(2, 3), torch.zeros(2, 1, dtype=torch.long)),
            ...     "train": (torch.zeros(4, 3), torch.ones(4, 1, dtype=torch.long)),
            ... }
            >>> tester = GlobalEmbeddingSpaceTester(data_device="cpu")
            >>> q, ql, r, rl = tester.set_reference_and_query(stored, "test", ["test", "train"])
            >>> q.shape, r.shape, rl[:, 0].tolist()
            (torch.Size([2, 3]), torch.Size([6, 3]), [0, 0, 1, 1, 1, 1])
        """
        query, query_labels = embeddings_and_labels[query_split_name]
        parts = [embeddings_and_labels[name] for name in reference_split_names]
        _check_same_levels(
            [(query, query_labels), *parts], [query_split_name, *reference_split_names]
        )
        if len(parts) == 1:
            return query, query_labels, parts[0][0], parts[0][1]
        reference = torch.cat([embeddings for embeddings, _ in parts])
        reference_labels = torch.cat([labels for _, labels in parts])
        return query, query_labels, reference, reference_labels

    def ref_includes_query(
        self, query_split_name: str, reference_split_names: Sequence[str]
    ) -> bool:
        """Whether the first rows of the reference are the query.

        Example:
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> tester = GlobalEmbeddingSpaceTester(data_device="cpu")
            >>> tester.ref_includes_query("val", ["val", "train"])
            True
        """
        return query_split_name in reference_split_names

    def _batch_getter(self) -> Callable[[Any], Any] | None:
        getter = self.data_and_label_getter
        return None if getter is return_input else getter

    def description_suffixes(self, base_name: str) -> str:
        """``base_name`` with 2.x's description of this tester's settings appended.

        As in 2.x: ``_pcaN``, ``_normalized``, ``_trunk`` when they apply, then the class
        name, ``_level_<levels>`` and ``_avg_of_avgs`` when the calculator averages per class.

        Example:
            >>> BaseTester().description_suffixes("val")
            'val_normalized_BaseTester_level_0'
        """
        if self.pca:
            base_name += f"_pca{self.pca}"
        if self.normalize_embeddings:
            base_name += "_normalized"
        if self.use_trunk_output:
            base_name += "_trunk"
        level = self.label_hierarchy_level
        levels = "_".join(map(str, level)) if isinstance(level, (list, tuple)) else str(level)
        base_name += f"_{type(self).__name__}_level_{levels}"
        if getattr(self.accuracy_calculator, "avg_of_avgs", False):
            base_name += "_avg_of_avgs"
        return base_name

    def accuracies_keyname(
        self, measure: str, label_hierarchy_level: int = 0, average: bool = False
    ) -> str:
        """The key of ``measure`` in ``all_accuracies``.

        Example:
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> GlobalEmbeddingSpaceTester(data_device="cpu").accuracies_keyname("NMI", 2)
            'NMI_level2'
            >>> GlobalEmbeddingSpaceTester(pca=16).accuracies_keyname("NMI", average=True)
            'AVERAGE_NMI_pca16'
        """
        name = f"AVERAGE_{measure}" if average else f"{measure}_level{label_hierarchy_level}"
        return name if self.pca is None else f"{name}_pca{self.pca}"

    def label_levels_to_evaluate(self, labels: torch.Tensor, split_name: str) -> list[int]:
        """The label columns ``label_hierarchy_level`` selects, checked against ``labels``.

        Example:
            >>> import torch
            >>> from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
            >>> tester = GlobalEmbeddingSpaceTester(label_hierarchy_level="all")
            >>> tester.label_levels_to_evaluate(torch.zeros(4, 3, dtype=torch.long), "val")
            [0, 1, 2]
        """
        num_levels = labels.shape[1]
        evaluable = self._evaluable_levels(num_levels)
        levels = self._requested_levels(list(range(evaluable)))
        if not levels or max(levels) >= evaluable:
            raise InvalidArgumentError(self._levels_error(num_levels, split_name))
        return levels

    def _evaluable_levels(self, num_levels: int) -> int:
        """How many of the ``num_levels`` label columns can be evaluated (the first ones)."""
        return num_levels

    def _levels_error(self, num_levels: int, split_name: str) -> str:
        return (
            f"The labels of split {split_name!r} have {num_levels} level(s), so "
            f"label_hierarchy_level={self.label_hierarchy_level!r} of {self._owner} cannot "
            f"be evaluated; use levels 0 to {num_levels - 1}, or labels shaped "
            "(num_samples, num_levels)."
        )

    def score_level(self, pair: ScoredPair, level: int) -> dict[str, Any]:
        """The metrics of one label level, ``{metric: value}``; subclasses define it.

        ``pair.query_labels`` and ``pair.reference_labels`` hold every level (2-D).
        """
        raise NotImplementedError(
            f"{self._owner} does not score embeddings; use GlobalEmbeddingSpaceTester, "
            "WithSameParentLabelTester or GlobalTwoStreamEmbeddingSpaceTester, or override "
            "score_level."
        )

    # ------------------------------------------------------------------ embedding

    @property
    def _owner(self) -> str:
        return type(self).__name__

    def _embed_splits(
        self,
        dataset_dict: Mapping[str, Any],
        names: list[str],
        trunk: Model,
        embedder: Model,
        collate_fn: Any,
    ) -> EmbeddingsAndLabels:
        """Embed each split once; check its labels for the chosen levels right away."""
        embeddings_and_labels = {}
        with _eval_mode(trunk, embedder):
            for name in names:
                embeddings, labels = self._embed(
                    dataset_dict[name], name, trunk, embedder, collate_fn
                )
                self.label_levels_to_evaluate(labels, name)
                embeddings_and_labels[name] = (embeddings, labels)
        return embeddings_and_labels

    def _process_group(self) -> TesterGroup | None:
        """The process group of a distributed tester, None for a single process."""
        if not self.distributed:
            return None
        calculator = self.accuracy_calculator
        return TesterGroup(calculator.group, calculator.timeout, self.embeddings_device)

    def _embed(
        self, dataset: Any, split_name: str, trunk: Model, embedder: Model, collate_fn: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass over a dataset, or over this rank's share when distributed."""

        def embed(indices: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
            return self._embed_items(dataset, indices, split_name, trunk, embedder, collate_fn)

        group = self._process_group()
        if group is None:
            return embed(None)
        return group.embed_share(lambda: _dataset_length(dataset, split_name), embed, split_name)

    def _embed_items(
        self,
        dataset: Any,
        indices: list[int] | None,
        split_name: str,
        trunk: Model,
        embedder: Model,
        collate_fn: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embed the items ``indices`` (None: all) into one preallocated tensor."""
        num_items = _dataset_length(dataset, split_name) if indices is None else len(indices)
        loader = DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=False,
            sampler=indices,
            num_workers=self.dataloader_num_workers,
            collate_fn=collate_fn,
        )
        store: EmbeddingStore | None = None
        with torch.no_grad():
            for batch in tqdm(
                loader, desc=f"Embedding {split_name}", disable=not self.progress_bar
            ):
                *inputs, raw_labels = self._unpack(batch, split_name)
                labels = batch_labels(raw_labels, self.label_mapper, split_name)
                outputs = [
                    self._forward(x, trunk, embedder, split_name, len(labels)) for x in inputs
                ]
                if store is None:
                    store = EmbeddingStore(
                        num_items, len(outputs), outputs[0], labels, self.embeddings_device
                    )
                store.write(outputs, labels, split_name)
        if store is None:
            raise InvalidArgumentError(f"Split {split_name!r} yielded no batches.")
        return store.finish(split_name)

    def _unpack(self, batch: Any, split_name: str) -> tuple[Any, ...]:
        """``(data, labels)`` of one batch."""
        return unpack_batch(batch, self._batch_getter(), "(data, label)", split_name)

    def _forward(
        self, data: Any, trunk: Model, embedder: Model, split_name: str, batch_len: int
    ) -> torch.Tensor:
        output = trunk(_to_device(data, self.data_device, self.dtype))
        if not self.use_trunk_output:
            output = embedder(output)
        if not isinstance(output, torch.Tensor) or output.ndim != 2 or len(output) != batch_len:
            got = f"shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else output
            raise InvalidArgumentError(
                f"The model's output for split {split_name!r} must be a 2-D tensor with one "
                f"row per item ({batch_len} in this batch). Got {got!r} instead."
            )
        output = float_if_integer(output)  # e.g. an identity trunk on integer data
        return output if self.pca is not None else self._normalize(output)

    def _normalize(self, embeddings: torch.Tensor) -> torch.Tensor:
        if not self.normalize_embeddings:
            return embeddings
        return torch.nn.functional.normalize(embeddings, p=2, dim=1)

    # ------------------------------------------------------------------ scoring

    def _protocol_arguments(self) -> list[str]:
        """The protocol options this tester was built with (those passed to get_accuracy)."""
        given = ["split_groups"] if self.split_groups is not None else []
        if self.single_gallery_shot:
            given.append("single_gallery_shot")
        if self.single_gallery_shot_draws is not None:
            given.append("single_gallery_shot_draws")
        return given

    def _check_protocol_allowed(self) -> None:
        """Refuse the protocol options the calculator cannot score with (a custom
        ``label_comparison_fn``), by the calculator's own check, before any embedding."""
        check = getattr(self.accuracy_calculator, "check_protocol_allowed", None)
        given = self._protocol_arguments()
        if given and callable(check):
            check(given, self._owner)

    def _check_plan(self, plan: list[tuple[str, tuple[str, ...]]]) -> None:
        """Refuse query/reference combinations this tester cannot evaluate."""

    def _check_groups_cover(
        self, plan: list[tuple[str, tuple[str, ...]]], dataset_dict: Mapping[str, Any]
    ) -> None:
        """Refuse ``split_groups`` that cannot serve ``plan`` before any embedding: every
        split evaluated (as query or reference) needs group ids, one per item of its
        dataset (every item is embedded, in dataset order), else hours of embedding end in
        the refusal :meth:`_groups` would give."""
        if self.split_groups is None:
            return
        evaluated = list(dict.fromkeys(name for query, refs in plan for name in (query, *refs)))
        self._check_groups_named(evaluated)
        for name in evaluated:
            length = _dataset_length(dataset_dict[name], name)
            if len(self.split_groups[name]) != length:
                raise invalid(
                    "split_groups",
                    self._owner,
                    f"one group id per item of split {name!r} ({length} items)",
                    f"{len(self.split_groups[name])} ids",
                )

    def _pca_rows(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The rows ``get_all_embeddings`` fits its PCA on: the reference part."""
        return embeddings

    def _evaluate(
        self, query_split_name: str, reference_split_names: tuple[str, ...], epoch: int
    ) -> dict[str, Any]:
        query, query_labels, reference, reference_labels = self.set_reference_and_query(
            self.embeddings_and_labels, query_split_name, reference_split_names
        )
        includes = self.ref_includes_query(query_split_name, reference_split_names)
        query, reference = self._project(query, reference, includes)
        levels = self.label_levels_to_evaluate(query_labels, query_split_name)
        self._visualize(query, query_labels, query_split_name, levels, epoch)
        logger.info(
            "Computing accuracy for the %s split w.r.t %s", query_split_name, reference_split_names
        )
        groups = self._groups(query_split_name, reference_split_names, (query, reference))
        pair = ScoredPair(
            query,
            query_labels,
            reference,
            reference_labels,
            includes,
            *groups,
            self.single_gallery_shot,
            self.single_gallery_shot_draws,
        )
        per_level = {level: self.score_level(pair, level) for level in levels}
        accuracies: dict[str, Any] = {"epoch": epoch}
        for level, scores in per_level.items():
            accuracies.update({self.accuracies_keyname(m, level): v for m, v in scores.items()})
        if not isinstance(self.label_hierarchy_level, int):
            accuracies.update(self._level_averages(per_level))
        return accuracies

    def _check_groups_named(self, names: Sequence[str]) -> None:
        """Every split of ``names`` has its ``split_groups``."""
        given = self.split_groups or {}
        missing = [name for name in names if name not in given]
        if missing:
            raise invalid(
                "split_groups",
                self._owner,
                f"group ids for every evaluated split (missing {missing})",
                sorted(given),
            )

    def _groups(
        self,
        query_split_name: str,
        reference_split_names: tuple[str, ...],
        embeddings: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The ``split_groups`` of the query split and of the reference splits (joined in
        order), checked against their embeddings; ``(None, None)`` without groups."""
        if self.split_groups is None:
            return None, None
        found = []
        for names, rows in (
            ((query_split_name,), embeddings[0]),
            (reference_split_names, embeddings[1]),
        ):
            self._check_groups_named(names)
            groups = torch.cat([self.split_groups[name] for name in names]).to(rows.device)
            if len(groups) != len(rows):
                raise invalid(
                    "split_groups",
                    self._owner,
                    f"one group id per item of {list(names)} ({len(rows)})",
                    f"{len(groups)} ids",
                )
            found.append(groups)
        return found[0], found[1]

    def _project(
        self, query: torch.Tensor, reference: torch.Tensor, includes: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PCA fitted on the reference, applied to both, then normalization."""
        if self.pca is None:
            return query, reference  # normalized batch by batch already
        projection = self._fit_pca(reference, self.pca)
        reference = self._normalize(projection.transform(reference))
        if includes:
            return reference[: len(query)], reference
        return self._normalize(projection.transform(query)), reference

    def _fit_pca(self, reference: torch.Tensor, dims: int) -> PCAProjection:
        """The PCA of the reference (of every rank's shard when distributed)."""
        group = self._process_group()
        if group is None:
            return fit_pca(reference, dims, self._owner)
        projection = fit_pca(reference, dims, self._owner, reduce=group.reduce_sum)
        # Every rank must project alike: an eigenvector's sign may differ between machines.
        return projection._replace(components=group.from_rank0(projection.components))

    def _level_averages(self, per_level: dict[int, dict[str, Any]]) -> dict[str, float]:
        """``AVERAGE_<metric>`` over the levels, for metrics that are numbers."""
        averages = {}
        for metric in next(iter(per_level.values())):
            values = [scores.get(metric) for scores in per_level.values()]
            if all(isinstance(v, numbers.Real) for v in values):
                mean = float(np.mean(np.asarray(values, dtype=np.float64)))
                averages[self.accuracies_keyname(metric, average=True)] = mean
        return averages

    def _requested_levels(self, all_levels: list[int]) -> list[int]:
        """The levels asked for; ``all_levels`` stands for "all"."""
        level = self.label_hierarchy_level
        if isinstance(level, str):
            return all_levels
        return [level] if isinstance(level, int) else list(level)

    def _visualize(
        self,
        query: torch.Tensor,
        labels: torch.Tensor,
        split_name: str,
        levels: list[int],
        epoch: int,
    ) -> None:
        if self.visualizer is None or self.visualizer_hook is None:
            return
        group = self._process_group()
        if group is not None:  # the visualizer sees every query, on rank 0 only
            stage = f"gathering split {split_name!r} for the visualizer"
            query, labels = group.gather(query, labels, stage)
            if group.rank != 0:
                return
        points = self.visualizer.fit_transform(query.detach().float().cpu().numpy())
        name = type(self.visualizer).__name__
        for level in levels:
            keyname = self.accuracies_keyname(name, level)
            level_labels = labels[:, level].cpu().numpy()
            self.visualizer_hook(self.visualizer, points, level_labels, split_name, keyname, epoch)

    def _end_of_testing(self, epoch: int) -> None:
        if self.end_of_testing_hook is not None:
            self.end_of_testing_hook(self)
        else:
            logger.info("Accuracies at epoch %s: %s", epoch, self.all_accuracies)


# ---------------------------------------------------------------------- helpers


def _identity(x: Any) -> Any:
    return x


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@contextmanager
def _eval_mode(*models: Any) -> Iterator[None]:
    """Put every ``nn.Module`` in eval mode, then restore each submodule's own mode."""
    modules = [m for model in models if isinstance(model, torch.nn.Module) for m in model.modules()]
    modes = [(module, module.training) for module in modules]
    for model in models:
        if isinstance(model, torch.nn.Module):
            model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _to_device(data: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Move tensors (also inside lists, tuples and dicts) and cast floating ones to dtype."""
    if isinstance(data, torch.Tensor):
        data = data.to(device)
        return data.to(dtype) if dtype is not None and data.is_floating_point() else data
    if isinstance(data, Mapping):
        return {key: _to_device(value, device, dtype) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(value, device, dtype) for value in data)
    return data


def _accuracy_calculator(value: Any, distributed: bool, owner: str) -> Any:
    """The calculator to use: a DistributedAccuracyCalculator exactly when distributed."""
    if value is None:
        return DistributedAccuracyCalculator() if distributed else AccuracyCalculator()
    opts.check_accuracy_calculator(value, owner)
    if distributed and not isinstance(value, DistributedAccuracyCalculator):
        raise invalid(
            "accuracy_calculator", owner,
            "None or a DistributedAccuracyCalculator when distributed=True", value,
        )  # fmt: skip
    if not distributed and isinstance(value, DistributedAccuracyCalculator):
        raise invalid(
            "accuracy_calculator", owner,
            "not a DistributedAccuracyCalculator unless distributed=True (each rank would "
            "pass the whole data as its shard)", value,
        )  # fmt: skip
    return value


def _check_dataset_dict(dataset_dict: Any) -> Mapping[str, Any]:
    if not isinstance(dataset_dict, Mapping) or not dataset_dict:
        raise invalid(
            "dataset_dict", "test()", "a non-empty dict of split name -> dataset", dataset_dict
        )
    return dataset_dict


def _dataset_length(dataset: Any, split_name: str) -> int:
    try:
        length = len(dataset)
    except TypeError as error:
        raise InvalidTypeError(
            f"Split {split_name!r} must be a dataset with __len__ and __getitem__. Got "
            f"{type(dataset).__name__} instead."
        ) from error
    if length == 0:
        raise InvalidArgumentError(f"Split {split_name!r} is empty; every split needs an item.")
    return length


def _check_same_levels(
    parts: list[tuple[torch.Tensor, torch.Tensor]], names: Sequence[str]
) -> None:
    levels = {name: labels.shape[1] for name, (_, labels) in zip(names, parts)}
    if len(set(levels.values())) > 1:
        raise InvalidArgumentError(
            f"Query and reference splits {list(dict.fromkeys(names))} must have the same "
            f"number of label levels. Got {levels} instead."
        )


def _check_single_shot(
    enabled: Any, draws: Any, distributed: bool, owner: str
) -> tuple[bool, int | None]:
    """The single-gallery-shot options, checked when the tester is built (not at the first
    evaluation): a bool, a positive number of draws only with it, not distributed."""
    enabled = opts.check_bool(enabled, "single_gallery_shot", owner)
    if draws is not None:
        if not enabled:
            raise invalid(
                "single_gallery_shot_draws",
                owner,
                "None unless single_gallery_shot=True",
                draws,
            )
        draws = check_positive_int(draws, "single_gallery_shot_draws", owner)
    if enabled and distributed:
        raise invalid(
            "single_gallery_shot",
            owner,
            "False with distributed=True (the single-shot CMC ranks every candidate of a "
            "query in one process)",
            enabled,
        )
    return enabled, draws


def _check_split_groups(
    split_groups: Mapping[str, Any] | None, distributed: bool, owner: str
) -> dict[str, torch.Tensor] | None:
    """``{split name: 1-D integer group ids, one per item in dataset order}``."""
    if split_groups is None:
        return None
    if not isinstance(split_groups, Mapping):
        raise invalid(
            "split_groups",
            owner,
            "a mapping of split names to group ids",
            split_groups,
            InvalidTypeError,
        )
    if distributed:
        raise invalid("split_groups", owner, "None with distributed=True", "group ids")
    checked = {}
    for name, groups in split_groups.items():
        checked[str(name)] = group_ids(
            groups, "split_groups", owner, f"1-D integer group ids for split {name!r}"
        )
    return checked
