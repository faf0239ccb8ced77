"""ScalingConfig(num_workers=(min_workers, max_workers)): validation and the local backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import cairn
from cairn import ConfigError, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]

ACCEPTED = (r"an integer >= 1, 0 \(local mode: the train function runs in this process\), "
            r"or a \(min_workers, max_workers\) tuple of integers with "
            r"1 <= min_workers <= max_workers, such as \(2, 4\)")


def test_a_range_whose_minimum_is_above_its_maximum_is_refused() -> None:
    with pytest.raises(ConfigError,
                       match=r"ScalingConfig.num_workers=\(3, 2\): min_workers=3 is greater "
                       r"than max_workers=2; num_workers must be " + ACCEPTED):
        ScalingConfig(num_workers=(3, 2))


@pytest.mark.parametrize(("value", "shown", "hint"), [
    ((0, 2), r"\(0, 2\): min_workers=0 must be >= 1; num_workers must be ", ""),
    ([1, 2], r"\[1, 2\] must be ", r" \(a tuple, not a list\)"),
    ((1, 2, 3), r"\(1, 2, 3\) must be ", ""),
    (("1", 2), r"\('1', 2\) must be ", ""),
    ((True, 2), r"\(True, 2\) must be ", ""),
    (2.0, r"2.0 must be ", ""),
    (-1, r"-1 must be ", ""),
])
def test_other_bad_values_are_refused_naming_what_is_accepted(
    value: object, shown: str, hint: str
) -> None:
    with pytest.raises(ConfigError,
                       match=r"ScalingConfig.num_workers=" + shown + ACCEPTED + hint
                       + r"(\.| \(Ray Train: .*\))$"):
        ScalingConfig(num_workers=value)  # type: ignore[arg-type]


def test_a_range_exposes_its_bounds_and_asks_for_the_most_resources() -> None:
    elastic = ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 2})
    assert elastic.elasticity_enabled
    assert (elastic.min_workers, elastic.max_workers) == (2, 4)
    assert elastic.total_resources == {"CPU": 8}
    fixed = ScalingConfig(num_workers=3)
    assert not fixed.elasticity_enabled
    assert (fixed.min_workers, fixed.max_workers) == (3, 3)
    assert ScalingConfig(num_workers=(2, 2)).max_workers == 2


def report_world_size() -> tuple[int, int]:
    context = cairn.get_context()
    cairn.report({"world_size": context.get_world_size(), "rank": context.get_world_rank()})
    return context.get_world_rank(), context.get_world_size()


def test_the_local_backend_runs_max_workers(
    run_config: RunConfigFactory,
) -> None:
    result = Trainer(report_world_size, scaling_config=ScalingConfig(num_workers=(1, 3)),
                     run_config=run_config()).fit()
    assert result.error is None
    assert result.return_value == (0, 3)
    assert result.metrics == {"world_size": 3, "rank": 0}
