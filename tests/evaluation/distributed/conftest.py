"""One spawned gloo group per size runs every case of the distributed tests."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from _dist_plans import full_plan
from _dist_workers import spawn

from _gloo import join_gloo_group


@pytest.fixture(scope="session", params=[2, 3], ids=["2ranks", "3ranks"])
def ran(request, tmp_path_factory) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """``(world size, cases by name, results by rank)``."""
    world = request.param
    plan = full_plan(world)
    results = spawn(plan, world, str(tmp_path_factory.mktemp(f"spawn{world}")))
    return world, {case["name"]: case for case in plan}, results


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo group of this process alone, for what needs no second rank."""
    join_gloo_group(tmp_path, 0, 1, 10)
    yield
    dist.destroy_process_group()
