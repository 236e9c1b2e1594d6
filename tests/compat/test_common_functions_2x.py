"""2.x-style use of utils.common_functions, checked against hand-computed values."""

from __future__ import annotations

import logging
import os
import unittest
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning import testers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator


class TestTestersOnEmbeddingDataset(unittest.TestCase):
    """The way 2.x tests build testers: precomputed embeddings and an identity trunk."""

    def test_global_embedding_space_tester(self):
        # points on a line, labels 0 0 1 1 1 2 2; nearest other point of each:
        # 1, 0, 1 (wrong label), 11, 10, 22, 20  -> precision@1 = 6/7
        embeddings = torch.tensor([0, 1, 3, 10, 11, 20, 22])[:, None]
        labels = torch.tensor([0, 0, 1, 1, 1, 2, 2])
        dataset_dict = {"train": c_f.EmbeddingDataset(embeddings, labels)}
        tester = testers.GlobalEmbeddingSpaceTester(
            normalize_embeddings=False,
            dataloader_num_workers=0,
            batch_size=3,
            accuracy_calculator=AccuracyCalculator(include=("precision_at_1", "r_precision")),
        )
        all_accuracies = tester.test(dataset_dict, 0, torch.nn.Identity())
        accuracies = all_accuracies["train"]
        self.assertAlmostEqual(accuracies["precision_at_1_level0"], 6 / 7)
        # R-precision: point 3 has R = 2 and its two nearest (1, 0) are label 0: 0; the
        # rest are 1.
        self.assertAlmostEqual(accuracies["r_precision_level0"], 6 / 7)

    def test_integer_embeddings_are_normalized_as_floats(self):
        # directions: a, b -> (1, 0); c -> (0, 1); e -> (0.6, 0.8), far out when raw
        points = torch.tensor([[2, 0], [5, 0], [0, 3], [30, 40]])
        dataset = c_f.EmbeddingDataset(points, torch.tensor([0, 0, 1, 1]))
        calc = AccuracyCalculator(include=("precision_at_1",))
        results = {}
        for normalize in (True, False):
            tester = testers.GlobalEmbeddingSpaceTester(
                normalize_embeddings=normalize, dataloader_num_workers=0, accuracy_calculator=calc
            )
            results[normalize] = tester.test({"val": dataset}, 0, torch.nn.Identity())
        # normalized: a->b, b->a, c->e, e->c, all right
        self.assertEqual(results[True]["val"]["precision_at_1_level0"], 1.0)
        # raw: a->b right, b->a right, c->a wrong, e->b wrong
        self.assertEqual(results[False]["val"]["precision_at_1_level0"], 0.5)

    def test_query_against_a_separate_reference(self):
        reference = c_f.EmbeddingDataset(torch.tensor([[0.0], [10.0]]), torch.tensor([0, 1]))
        query = c_f.EmbeddingDataset(torch.tensor([[1.0], [6.0], [9.0]]), torch.tensor([0, 0, 1]))
        tester = testers.GlobalEmbeddingSpaceTester(
            normalize_embeddings=False,
            dataloader_num_workers=0,
            accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        )
        all_accuracies = tester.test(
            {"query": query, "reference": reference},
            1,
            torch.nn.Identity(),
            splits_to_eval=[("query", ["reference"])],
        )
        # 1 -> 0 (label 0, right), 6 -> 10 (label 1, wrong), 9 -> 10 (right)
        self.assertAlmostEqual(all_accuracies["query"]["precision_at_1_level0"], 2 / 3)

    def test_eval_dataloader(self):
        dataset = c_f.EmbeddingDataset(torch.arange(5)[:, None], torch.arange(5) % 2)
        loader = c_f.get_eval_dataloader(dataset, 2, 0, None)
        batches = [labels.tolist() for _, labels in loader]
        self.assertEqual(batches, [[0, 1], [0, 1], [0]])
        self.assertEqual(len(dataset), 5)


class TestLabelHelpers(unittest.TestCase):
    def test_label_maps(self):
        self.assertEqual(c_f.make_label_to_rank_dict([7, 3, 5]), {7: 2, 3: 0, 5: 1})
        with self.assertRaises(ValueError):
            c_f.make_label_to_rank_dict([1, 1, 2])
        label_map = c_f.get_label_map(np.array([[10, 5], [30, 5], [20, 9]]))
        self.assertEqual(label_map, {0: {10: 0, 20: 1, 30: 2}, 1: {5: 0, 9: 1}})
        self.assertEqual(c_f.get_label_map([4, 2, 4]), {0: {2: 0, 4: 1}})

    def test_hierarchy_label(self):
        labels = np.array([[1, 7, 9], [2, 8, 9]])
        self.assertEqual(c_f.get_hierarchy_label(labels, 1).tolist(), [7, 8])
        self.assertEqual(c_f.get_hierarchy_label(labels, [0, 2]).tolist(), [[1, 9], [2, 9]])
        self.assertIs(c_f.get_hierarchy_label(labels, "all"), labels)
        with self.assertRaises(ValueError):
            c_f.get_hierarchy_label(labels, 3)
        with self.assertRaises(ValueError):
            c_f.get_hierarchy_label(np.array([1, 2]), 1)

    def test_process_label_with_a_label_mapper(self):
        mapper = c_f.LabelMapper(
            set_min_label_to_zero=True, dataset_labels=[[10, 5], [30, 5], [20, 9]]
        )
        labels = torch.tensor([[30, 9], [10, 5]])
        self.assertEqual(c_f.map_labels(mapper.map, labels).tolist(), [[2, 1], [0, 0]])
        got = c_f.process_label(labels, 0, mapper.map)
        self.assertIsInstance(got, torch.Tensor)
        self.assertEqual(got.tolist(), [2, 0])
        # a list of per-level label tensors is stacked as columns, as 2.x did
        got = c_f.process_label([torch.tensor([30, 10]), torch.tensor([9, 5])], 1, mapper.map)
        self.assertEqual(got.tolist(), [1, 0])
        unchanged = c_f.LabelMapper()
        self.assertEqual(c_f.process_label(torch.tensor([8, 3]), 0, unchanged.map).tolist(), [8, 3])


class TestTensorHelpers(unittest.TestCase):
    def test_conversions(self):
        array = np.array([1.5, 2.5])
        tensor = c_f.numpy_to_torch(array)
        self.assertIsInstance(tensor, torch.Tensor)
        self.assertEqual(tensor.tolist(), [1.5, 2.5])
        self.assertEqual(c_f.numpy_to_torch([1, 2]), [1, 2])
        self.assertIsInstance(c_f.to_numpy(torch.ones(2, requires_grad=True)), np.ndarray)
        self.assertEqual(c_f.to_numpy("text"), "text")
        self.assertTrue(c_f.is_list_or_tuple([1]) and c_f.is_list_or_tuple((1,)))
        self.assertFalse(c_f.is_list_or_tuple(torch.ones(1)))
        self.assertIn(c_f.use_cuda_if_available().type, ("cuda", "cpu"))

    def test_dtype_and_device(self):
        x = torch.tensor([1, 2])
        self.assertEqual(c_f.to_dtype(x, dtype=torch.float16).dtype, torch.float16)
        self.assertEqual(
            c_f.to_dtype(x, tensor=torch.zeros(1, dtype=torch.float64)).dtype, torch.float64
        )
        moved = c_f.to_device(x, tensor=torch.zeros(1), dtype=torch.float32)
        self.assertEqual((moved.device.type, moved.dtype), ("cpu", torch.float32))
        self.assertIs(c_f.to_device(x, device="cpu"), x)

    def test_all_from_dim_to_end_and_standard_scaler(self):
        x = torch.tensor([[[1, 1], [1, 1]], [[1, 0], [1, 1]]]).bool()
        self.assertEqual(c_f.torch_all_from_dim_to_end(x, 1).tolist(), [True, False])
        self.assertEqual(
            c_f.torch_all_from_dim_to_end(x, 2).tolist(), [[True, True], [False, True]]
        )
        data = np.array([[1.0, 10.0], [2.0, 30.0], [6.0, 20.0]])
        want = (data - data.mean(axis=0)) / data.std(axis=0, ddof=1)
        got = c_f.torch_standard_scaler(torch.from_numpy(data)).numpy()
        np.testing.assert_allclose(got, want)

    def test_check_shapes(self):
        c_f.check_shapes(torch.zeros(3, 2), torch.zeros(3))
        c_f.check_shapes(torch.zeros(3, 2), None)
        with self.assertRaisesRegex(ValueError, "labels"):
            c_f.check_shapes(torch.zeros(3, 2), torch.zeros(2))
        with self.assertRaisesRegex(ValueError, "1-D"):
            c_f.check_shapes(torch.zeros(3, 2), torch.zeros(3, 1))


class TestLogger(unittest.TestCase):
    def test_logger_name(self):
        self.assertEqual(c_f.LOGGER_NAME, "PML")
        self.assertIsInstance(c_f.LOGGER, logging.Logger)
        c_f.set_logger_name("renamed")
        try:
            self.assertEqual((c_f.LOGGER_NAME, c_f.LOGGER.name), ("renamed", "renamed"))
            with self.assertLogs("renamed", level="INFO") as logs:
                logging.getLogger("pytorch_metric_learning.utils.anything").warning("hello")
            self.assertEqual(logs.records[0].getMessage(), "hello")
        finally:
            c_f.set_logger_name("PML")
        from pytorch_metric_learning.utils.common_functions import LOGGER

        self.assertEqual(LOGGER.name, "PML")
        with self.assertRaises(TypeError):
            c_f.set_logger_name(3)

    def test_silenced_2x_logger_gets_nothing(self):
        seen = []
        handler = logging.Handler()
        handler.emit = seen.append
        c_f.LOGGER.addHandler(handler)
        c_f.LOGGER.setLevel(logging.ERROR)
        try:
            logging.getLogger("pytorch_metric_learning.x").warning("quiet")
        finally:
            c_f.LOGGER.removeHandler(handler)
            c_f.LOGGER.setLevel(logging.NOTSET)
        self.assertEqual(seen, [])


class TestModelFiles:
    def test_modelpath_creator(self):
        assert c_f.modelpath_creator("f", "trunk", 3) == os.path.join("f", "trunk_3.pth")
        assert c_f.modelpath_creator("f", "trunk", None) == os.path.join("f", "trunk.pth")
        assert c_f.modelpath_creator("f", "trunk", "best2", ".pt") == os.path.join(
            "f", "trunk_best2.pt"
        )

    def test_save_and_load_dict_of_models(self, tmp_path):
        torch.manual_seed(0)
        models = {
            "trunk": torch.nn.DataParallel(torch.nn.Linear(3, 2)),
            "embedder": torch.nn.Linear(2, 2),
        }
        c_f.save_dict_of_models(models, 4, str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == ["embedder_4.pth", "trunk_4.pth"]
        saved = torch.load(tmp_path / "trunk_4.pth", weights_only=True)
        assert sorted(saved) == ["bias", "weight"]  # unwrapped from DataParallel
        fresh = {
            "trunk": torch.nn.Linear(3, 2),
            "embedder": torch.nn.DataParallel(torch.nn.Linear(2, 2)),
        }
        c_f.load_dict_of_models(fresh, 4, str(tmp_path), "cpu")
        assert torch.equal(fresh["trunk"].weight, models["trunk"].module.weight)
        assert torch.equal(fresh["embedder"].module.bias, models["embedder"].bias)

    def test_load_model_of_a_dataparallel_file(self, tmp_path):
        source = torch.nn.Linear(2, 2)
        path = tmp_path / "old.pth"
        torch.save({"module." + k: v for k, v in source.state_dict().items()}, path)
        target = torch.nn.Linear(2, 2)
        c_f.load_model(target, str(path), "cpu")
        assert torch.equal(target.weight, source.weight)

    def test_load_model_is_weights_only(self, tmp_path):
        path = tmp_path / "evil.pth"
        torch.save({"weight": torch.zeros(2, 2), "payload": Payload()}, path)
        with pytest.raises(Exception, match="(?i)weights"):
            c_f.load_model(torch.nn.Linear(2, 2), str(path), "cpu")

    def test_failed_save_keeps_the_old_file(self, tmp_path, monkeypatch):
        path = str(tmp_path / "trunk_1.pth")
        c_f.save_model(torch.nn.Linear(2, 2), path)
        before = Path(path).read_bytes()

        def broken_save(obj, f, *args, **kwargs):
            f.write(b"half a file")
            raise OSError("disk full")

        monkeypatch.setattr(torch, "save", broken_save)
        with pytest.raises(OSError):
            c_f.save_model(torch.nn.Linear(2, 2), path)
        assert Path(path).read_bytes() == before
        assert os.listdir(tmp_path) == ["trunk_1.pth"]

    def test_failed_save_is_logged_and_raised_on_request(self, tmp_path, caplog):
        blocker = tmp_path / "file"
        blocker.write_text("not a folder")
        models = {"trunk": torch.nn.Linear(2, 2)}
        with caplog.at_level(logging.WARNING):
            c_f.save_dict_of_models(models, 1, str(blocker))  # only logged, as in 2.x
        assert "Could not SAVE" in caplog.text
        with pytest.raises(OSError):
            c_f.save_dict_of_models(models, 1, str(blocker), assert_success=True)
        assert blocker.read_text() == "not a folder"

    def test_latest_version(self, tmp_path):
        assert c_f.latest_version(str(tmp_path)) == (0, None)
        for name in [
            "trunk_1.pth",
            "trunk_10.pth",
            "trunk_9.pth",
            "trunk_best7.pth",
            "embedder_20.pth",
        ]:
            (tmp_path / name).write_bytes(b"")
        assert c_f.latest_version(str(tmp_path)) == (10, 10)
        assert c_f.latest_version(str(tmp_path), best=True) == (7, "best7")
        assert c_f.latest_version(str(tmp_path), "embedder_*.pth") == (20, 20)

    def test_delete_dict_of_models(self, tmp_path):
        models = {"trunk": torch.nn.Linear(2, 2), "embedder": torch.nn.Linear(2, 2)}
        c_f.save_dict_of_models(models, 2, str(tmp_path))
        c_f.save_dict_of_models(models, 3, str(tmp_path))
        (tmp_path / "classifier_2.pth").mkdir()  # a folder is never removed
        c_f.delete_dict_of_models({**models, "classifier": None, "missing": None}, 2, str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == ["classifier_2.pth", "embedder_3.pth", "trunk_3.pth"]


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))
