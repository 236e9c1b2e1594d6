"""A third-party k-NN backend used by the registry tests: brute force in plain PyTorch."""

import torch


class ToyKNN:
    def __init__(self, largest=False):
        self.largest = largest

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        reference = query if reference is None else reference
        scores = torch.cdist(query, reference)
        offset = 1 if ref_includes_query else 0
        values, indices = torch.topk(scores, k + offset, dim=1, largest=self.largest)
        return values[:, offset:], indices[:, offset:]
