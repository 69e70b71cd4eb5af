"""bench_collapse's command line: the levers it changes and the folder each run is kept in."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_collapse")


def test_levers_are_read_as_python_values_else_strings(bench) -> None:
    changes = bench.field_values(["learning_rate=2e-4", "reward_weights=(1.0, 0.0, 0.0, 0.0, 0.0)",
                                  "scale_rewards=none", "mask_truncated_completions=True"])  # fmt: skip
    assert changes == {"learning_rate": 2e-4, "reward_weights": (1.0, 0.0, 0.0, 0.0, 0.0),
                       "scale_rewards": "none", "mask_truncated_completions": True}  # fmt: skip


@pytest.mark.parametrize("pair", ["learning_rate", "=2e-4", ""])
def test_a_lever_without_field_and_value_is_refused(bench, pair: str) -> None:
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        bench.field_values([pair])


def test_each_set_of_levers_keeps_its_runs_in_a_folder_of_its_own(bench) -> None:
    def label(sets: list[str], grpo: list[str]) -> str:
        return bench.run_label(argparse.Namespace(set=sets, grpo=grpo))

    assert label([], []) == "as-defined"
    weights = label(["reward_weights=(1.0, 0.0, 0.0, 0.0, 0.0)"], [])
    assert "/" not in weights and " " not in weights and "(" not in weights
    assert weights != label(["reward_weights=(1.0, 0.2, 0.2, 0.2, 0.2)"], [])
    assert label(["learning_rate=2e-4"], ["beta=0.0"]) == "learning_rate=2e-4_beta=0.0"
