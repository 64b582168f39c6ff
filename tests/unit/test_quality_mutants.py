"""Each quality rule of placement and preemption, removed from a copy of the source, turns its test red.

A test that survives the removal of the rule it names pins nothing (the brief: swap best-fit for
worst-fit, drop the cap, watch the test go red). Each mutant below edits one line of a copy of
`operator/tidal`, then runs the test that pins the rule against that copy (PYTHONPATH first, so the
installed package is not the one imported). When the code a mutant edits changes, this test says
so and the mutant must be rewritten, not dropped. Known survivor, not listed: the preemption
greedy's last tie-break (the larger of two moves with equal room per GPU and finished groups);
see the README's placement benchmarks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GANG = "placement/gang.py"
PREEMPTION = "placement/preemption.py"
QUALITY = "tests/unit/test_placement_quality.py::"
PREEMPT = "tests/unit/test_preemption.py::"


@dataclass(frozen=True)
class Mutant:
    rule: str
    module: str
    """Path under operator/tidal."""
    original: str
    mutated: str
    pinned_by: str
    """The pytest node id that must fail."""


MUTANTS = [
    Mutant(
        "best-fit block on a tie of the leftover score",
        GANG,
        "key = (round(lost, 6), block_capacity[b], b)",
        "key = (round(lost, 6), -block_capacity[b], b)",
        QUALITY + "test_the_fuller_block_wins_when_the_leftover_score_ties",
    ),
    Mutant(
        "the fullest blocks are the ones scored",
        GANG,
        "fitting = sorted(fitting, key=lambda b: (block_capacity[b], b))[:BLOCKS_SCORED]",
        "fitting = sorted(fitting, key=lambda b: (-block_capacity[b], b))[:BLOCKS_SCORED]",
        QUALITY + "test_the_fullest_blocks_are_the_ones_scored_when_many_fit",
    ),
    Mutant(
        "fullest nodes first inside a supernode",
        GANG,
        "members.append((not n.spare if spares_first else n.spare, free, n.name))",
        "members.append((not n.spare if spares_first else n.spare, -free, n.name))",
        QUALITY + "test_recovery_order_own_spares_then_other_racks_free_nodes_then_their_spares",
    ),
    Mutant(
        "leftover score, not the tightest supernode",
        GANG,
        "single_lost, _, name = min(singles)\n        if single_lost <= round(lost, 9):",
        "single_lost, _, name = min(singles, key=lambda s: (s[1], s[2]))\n        if True:",
        QUALITY + "test_a_small_group_goes_where_it_costs_queued_sizes_nothing_not_into_the_tightest_hole",
    ),
    Mutant(
        "an empty domain is worth its GPUs once more",
        GANG,
        "WHOLE_DOMAIN_WEIGHT = 1.0",
        "WHOLE_DOMAIN_WEIGHT = 0.0",
        QUALITY + "test_an_empty_domain_is_worth_more_than_its_group_sizes",
    ),
    Mutant(
        "joining a partly used supernode costs its chance to be whole",
        GANG,
        "RESIDENT_WEIGHT = 4.0",
        "RESIDENT_WEIGHT = 0.0",
        QUALITY + "test_a_small_group_joins_the_busier_of_two_equal_holes",
    ),
    Mutant(
        "all groups in one supernode compared with the greedy steps",
        GANG,
        "if singles:  # by total loss",
        "if False:  # by total loss",
        QUALITY + "test_queued_group_sizes_keep_the_empty_rack_for_the_job_that_fits_it",
    ),
    Mutant(
        "other racks' free nodes before their spares",
        GANG,
        "for tier in (others, spares):",
        "for tier in (spares, others):",
        QUALITY + "test_recovery_takes_other_racks_free_nodes_before_any_of_their_spares",
    ),
    Mutant(
        "room beyond the shortfall is worth nothing",
        PREEMPTION,
        "value = float(target) - now",
        "value = float(groups) - now",
        PREEMPT + "test_room_beyond_the_shortfall_is_worth_nothing",
    ),
    Mutant(
        "a victim's pods on one node count together",
        PREEMPTION,
        "per_node[name] = per_node.get(name, 0) + g",
        "per_node[name] = g",
        PREEMPT + "test_a_victims_pods_on_one_node_count_together",
    ),
    Mutant(
        "ties go to more finished groups (fewer victims)",
        PREEMPTION,
        "key = (-round(value / m.cost, 12), -whole, -m.cost,",
        "key = (-round(value / m.cost, 12), whole, -m.cost,",
        PREEMPT + "test_ties_go_to_fewer_victims",
    ),
    Mutant(
        "the plan gives back what it can do without",
        PREEMPTION,
        "    def _prune(self, st: _State, levels: list[int], target: int) -> None:\n",
        "    def _prune(self, st: _State, levels: list[int], target: int) -> None:\n        return\n",
        PREEMPT + "test_gives_back_what_the_plan_can_do_without",
    ),
]


@pytest.fixture(scope="module")
def pristine_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    shutil.copytree(REPO / "operator" / "tidal", root / "tidal", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(source_root: Path, *node_ids: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.rule for m in MUTANTS])
def test_removing_the_rule_turns_its_test_red(mutant: Mutant, pristine_copy: Path, tmp_path: Path) -> None:
    shutil.copytree(pristine_copy / "tidal", tmp_path / "tidal")
    source = tmp_path / "tidal" / mutant.module
    text = source.read_text()
    assert text.count(mutant.original) == 1, f"{mutant.module} changed: rewrite the mutant for {mutant.rule!r}"
    source.write_text(text.replace(mutant.original, mutant.mutated))
    imported = subprocess.run(
        [sys.executable, "-c", "import tidal; print(tidal.__file__)"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert imported.stdout.startswith(str(tmp_path)), imported  # the copy, not the installed package
    result = _run(tmp_path, mutant.pinned_by)
    assert result.returncode == 1 and "1 failed" in result.stdout, (
        f"{mutant.pinned_by} survives the removal of {mutant.rule!r}:\n{result.stdout[-2000:]}"
    )


def test_every_pinning_test_passes_on_the_unmutated_copy(pristine_copy: Path) -> None:
    # Otherwise a test red for an unrelated reason (a typo in its node id included) would count as pinning.
    result = _run(pristine_copy, *(m.pinned_by for m in MUTANTS))
    assert result.returncode == 0, result.stdout[-2000:]
