"""The error a failed run reads back with: the lowest failed rank's own exception, with
every rank that failed the same way."""

from __future__ import annotations

from cairn._src.controller.failure_errors import error_summary, run_error


def test_the_lowest_rank_s_error_with_every_rank_that_failed_alike() -> None:
    errors = [error_summary(ValueError("bad batch"), ranks=(0,)),
              error_summary(KeyError("x"), ranks=(1,)),
              error_summary(ValueError("bad batch"), ranks=(3,))]
    assert run_error(errors) == {"type": "ValueError", "ranks": [0, 3],
                                  "message": "bad batch"}


def test_a_message_that_differs_is_another_error() -> None:
    errors = [error_summary(ValueError("rank 0"), ranks=(0,)),
              error_summary(ValueError("rank 1"), ranks=(1,))]
    assert run_error(errors) == {"type": "ValueError", "ranks": [0], "message": "rank 0"}


def test_no_rank_errors_gives_none() -> None:
    assert run_error([]) is None
