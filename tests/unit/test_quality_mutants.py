"""Each quality rule of placement, preemption and defragmentation, removed from a copy of the source,
turns its test red.

A test that survives the removal of the rule it names pins nothing (the brief: swap best-fit for
worst-fit, drop the cap, watch the test go red). Each mutant below edits one to three lines of a copy of
`operator/tidal`, then runs the test that pins the rule against that copy (PYTHONPATH first, so the
installed package is not the one imported), together with the module's safety property tests,
which must still pass: the mutant must make worse plans, not broken ones (a mutant marked
`safe=False` removes a safety rule, and they must fail too). When the code a mutant edits changes,
this test says so and the mutant must be rewritten, not dropped.

Known survivor, not listed: the preemption greedy's last tie-break (the larger of two moves with
equal room per GPU and finished groups; see the README's placement benchmarks).
"""

from __future__ import annotations

import json
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
PREEMPTION_DP = "placement/preemption_dp.py"
DEFRAG = "placement/defrag.py"
QUOTA = "placement/quota_eviction.py"
ADMISSION = "k8s/admission.py"
QUOTAS = "k8s/quota.py"
ROOMS = "k8s/return_rooms.py"
REGROW = "k8s/rebalancing.py"
TRAINING = "k8s/training.py"
LEDGER = "k8s/disruption_ledger.py"
OUTAGE = "k8s/outage.py"
MANIFESTS = "k8s/manifests.py"
CONTROLLER = "k8s/controller.py"
CYCLE = "k8s/cycle.py"
CYCLE_LOG = "k8s/cycle_log.py"
RUNNER = "k8s/runner.py"
INFORMER = "k8s/informer.py"
HANDLERS = "k8s/handlers.py"
SUPERNODES = "k8s/supernodes.py"
DISCOVERY_TESTS = "tests/unit/test_discovery.py::"
WATCH = "k8s/watch.py"
LIVE = "k8s/live_resize.py"
API = "k8s/api.py"
WRITE = "k8s/write.py"
STATUS = "k8s/status.py"
SERVER_DEFAULTS = "model/server_defaults.py"
STATUS_TESTS = "tests/unit/test_status_versions.py::"
DEFAULTS_TESTS = "tests/unit/test_server_defaults.py::"
CAPACITY = "rebalance/capacity.py"
RESIZE_COST = "rebalance/resize_cost.py"
DEMAND = "rebalance/demand.py"
ENGINE = "sim/engine.py"
SIM_POLICIES = "sim/policies.py"
SIM_RUN = "sim/run.py"
COST_TESTS = "tests/unit/test_resize_cost.py::"
TIDE = "tests/unit/test_sim_tide.py::"
SIM_CONSERVED = (
    "tests/unit/test_sim.py::test_gpus_and_jobs_conserved_at_every_event[tidal]",
    TIDE + "test_gpus_and_jobs_conserved_with_live_resizes[tidal]",
)
QUALITY = "tests/unit/test_placement_quality.py::"
PLACEMENT = "tests/unit/test_placement.py::"
PREEMPT = "tests/unit/test_preemption.py::"
OPTIMAL = "tests/unit/test_preemption_optimality.py::"
DEFRAGS = "tests/unit/test_defrag.py::"
MOVES = "tests/unit/test_defrag_operator.py::"
ROOM_TESTS = "tests/unit/test_return_rooms.py::"
GRACE = "tests/unit/test_checkpoint_grace.py::"
QUOTA_TESTS = "tests/unit/test_quota_eviction.py::"
TENANCY = "tests/unit/test_tenancy.py::"
REBALANCE = "tests/unit/test_rebalance.py::"
LEDGER_TESTS = "tests/unit/test_disruption_ledger.py::"
FAILURES = "tests/unit/test_failures.py::"
CHECKS = "tests/unit/test_admission_checks.py::"
MASS_NOT_READY = FAILURES + "test_most_nodes_not_ready_at_once_restart_nothing_but_a_few_do[most nodes]"
RACK_NOT_READY = FAILURES + "test_most_nodes_not_ready_at_once_restart_nothing_but_a_few_do[a rack's share]"
ONE_NOT_READY = FAILURES + "test_not_ready_node_replaces_its_group_on_the_same_supernode_spares_first"
LOST_NODE_TOLERATION = (
    FAILURES + "test_tidals_pods_tolerate_a_lost_node_without_a_time_limit_unless_the_template_says_otherwise"
)
DELETED_JOB_BUDGET = REBALANCE + "test_a_deleted_jobs_evictions_still_count_against_the_budget_across_a_restart"
SAFETY = {
    GANG: ("tests/unit/test_placement_properties.py",),
    PREEMPTION: (
        PREEMPT + "test_preemption_invariants",
        PREEMPT + "test_preemption_invariants_on_seeded_clusters_that_need_evictions",
    ),
    PREEMPTION_DP: (
        PREEMPT + "test_preemption_invariants",
        PREEMPT + "test_preemption_invariants_on_seeded_clusters_that_need_evictions",
    ),
    DEFRAG: (
        DEFRAGS + "test_defrag_invariants",
        DEFRAGS + "test_defrag_on_fragmented_racks_keeps_every_invariant",
        DEFRAGS + "test_the_greedy_alone_on_fragmented_racks_keeps_every_invariant",
    ),
    # A room is taken only where it still is a valid placement (never over-booked).
    ROOMS: (ROOM_TESTS + "test_plan_on_refuses_a_room_that_is_no_longer_valid",),
    REGROW: (ROOM_TESTS + "test_plan_on_refuses_a_room_that_is_no_longer_valid",),
    # Never a victim twice, never more than the candidates, None when they cannot cover it.
    QUOTA: (QUOTA_TESTS + "test_nothing_short_evicts_nothing_and_too_little_is_none",),
    # Nothing is evicted for a quota when it may not be or would not make the job fit.
    ADMISSION: (TENANCY + "test_nothing_is_evicted_for_a_quota_when_it_would_not_make_the_job_fit_or_may_not",),
    QUOTAS: (TENANCY + "test_nothing_is_evicted_for_a_quota_when_it_would_not_make_the_job_fit_or_may_not",),
    # The disruption budget binds on the jobs still there.
    LEDGER: (REBALANCE + "test_disruption_budget_is_respected_by_the_operator",),
    # A few NotReady nodes still restart their groups.
    OUTAGE: (ONE_NOT_READY,),
    CONTROLLER: (ONE_NOT_READY,),
    # A pod on a node that may still run it is never forced.
    CYCLE: (
        CHECKS + "test_pods_of_a_not_ready_node_are_not_force_deleted_and_their_group_waits_for_the_fence",
        CHECKS + "test_the_out_of_service_taint_on_a_ready_node_does_not_force_a_delete",
    ),
    # The container's own process still takes the pod's name.
    RUNNER: ("tests/unit/test_peering_id.py::test_the_containers_own_process_is_the_pod",),
    # Pods that matter still reach the cache; a failed cycle still restarts from a listing.
    INFORMER: ("tests/unit/test_informer.py::test_events_of_interesting_pods_reach_the_cache_and_others_never_do",),
    HANDLERS: (
        "tests/unit/test_handlers.py::test_a_failing_cycle_is_an_error_restarts_from_a_listing_and_fails_healthz",
    ),
    # Discovery still creates a missing Supernode once, and nothing that exists.
    SUPERNODES: (DISCOVERY_TESTS + "test_work_seeds_once_creates_what_is_missing_and_tells_the_node_that_named_it",),
    # A quiet cluster still logs no cycle summaries.
    CYCLE_LOG: ("tests/unit/test_cycle_log.py::test_quiet_cycles_log_nothing_however_long_the_wait",),
    API: ("tests/unit/test_api_retry.py::test_throttling_and_server_errors_are_retried_with_backoff",),
    # Failed deletes are still reported and the write order kept.
    WRITE: ("tests/unit/test_write.py::test_failed_deletes_are_reported_and_succeeded_domain_deletes_remembered",),
    # A status another writer changed is still never overwritten.
    STATUS: (STATUS_TESTS + "test_a_status_another_writer_changed_is_not_overwritten_and_is_decided_from_next",),
    # A field already there is still kept as it is.
    SERVER_DEFAULTS: (DEFAULTS_TESTS + "test_present_fields_and_objects_without_defaults_are_left_as_they_are",),
    # The cache still follows watched pods.
    WATCH: ("tests/unit/test_watch_cache.py::test_membership_follows_label_changes_through_the_index",),
    # A suspension of a Live job is still checkpoint-first.
    LIVE: ("tests/unit/test_live_resize.py::test_a_live_job_is_suspended_checkpoint_first",),
    # tidal's pods keep the accelerator's toleration the GPU nodes' taint needs.
    MANIFESTS: (CHECKS + "test_gpu_nodes_tainted_for_gpu_pods_only_stay_open_and_the_pods_carry_the_toleration",),
    # An eviction whose preemptor no longer waits is called off; one it still waits for goes ahead.
    TRAINING: (
        "tests/unit/test_live_resize.py::test_a_live_job_is_suspended_checkpoint_first",
        GRACE + "test_a_preemption_whose_preemptor_no_longer_waits_is_called_off",
        GRACE + "test_a_preemption_whose_preemptor_still_waits_goes_ahead",
        GRACE + "test_a_called_off_preemption_nobody_takes_over_is_told_once_at_the_end_of_the_cycle",
    ),
    # The planner still makes room within the budget, and prefers a cheap Live shrink.
    CAPACITY: (
        REBALANCE + "test_disruption_budget_limits_what_is_taken",
        COST_TESTS + "test_a_live_shrink_stays_the_cheapest_way",
    ),
    RESIZE_COST: (COST_TESTS + "test_without_costs_the_shrink_stage_comes_first",),
    # Training still grows back at night and the day pool still gets its replicas.
    DEMAND: (REBALANCE + "test_compressed_day_checkpoint_before_eviction_and_back_at_night",),
    # The simulator still conserves GPUs and jobs at every event, Live resizes included.
    ENGINE: SIM_CONSERVED,
    SIM_POLICIES: SIM_CONSERVED,
    SIM_RUN: SIM_CONSERVED,
}
"""The module's property tests of the safety invariants: a mutant must still pass them, so that it
makes plans that are valid but worse (the rule removed), not plans that are broken."""


@dataclass(frozen=True)
class Mutant:
    rule: str
    module: str
    """Path under operator/tidal."""
    original: str
    mutated: str
    pinned_by: str
    """The pytest node id that must fail."""
    safe: bool = True
    """False for a mutant that removes a safety rule: its property tests must then fail too."""
    more: tuple[tuple[str, str], ...] = ()
    """Further (original, mutated) edits of the same module, when the rule is written in several places."""


MUTANTS = [
    # placement (plan_gang)
    Mutant(
        "best-fit block on a tie of the leftover score",
        GANG,
        "key = (round(lost, 6), block_capacity[b], b)",
        "key = (round(lost, 6), b)",
        QUALITY + "test_the_fuller_block_wins_when_the_leftover_score_ties",
    ),
    Mutant(
        "the leftover score before best-fit block",
        GANG,
        "key = (round(lost, 6), block_capacity[b], b)",
        "key = (block_capacity[b], round(lost, 6), b)",
        QUALITY + "test_the_block_whose_leftover_loses_least_wins_over_the_fullest_block",
    ),
    Mutant(
        "the fullest blocks are the ones scored",
        GANG,
        "fitting = sorted(fitting, key=lambda b: (block_capacity[b], b))[:BLOCKS_SCORED]",
        "fitting = sorted(fitting, key=lambda b: (-block_capacity[b], b))[:BLOCKS_SCORED]",
        QUALITY + "test_the_fullest_blocks_are_the_ones_scored_when_many_fit",
    ),
    Mutant(
        "largest blocks first when none suffices",
        GANG,
        "block = max(block_capacity, key=lambda b: (block_capacity[b], b))",
        "block = min(block_capacity, key=lambda b: (block_capacity[b], b))",
        QUALITY + "test_the_largest_blocks_go_first_when_no_block_suffices",
    ),
    Mutant(
        "a single group competes in every block",
        GANG,
        "if wanted == 1:",
        "if False:",
        QUALITY + "test_a_single_group_competes_in_every_block_however_many_there_are",
    ),
    Mutant(
        "fullest nodes first inside a supernode",
        GANG,
        "members.sort()  # fullest first; others' spares last",
        "members.sort(key=lambda m: (m[0], -m[1], m[2]))  # fullest first; others' spares last",
        PLACEMENT + "test_fullest_nodes_are_used_first_inside_a_supernode",
    ),
    Mutant(
        "other racks' spares last inside their rack",
        GANG,
        "members.append((not n.spare if spares_first else n.spare, free, n.name))",
        "members.append((not n.spare if spares_first else not n.spare, free, n.name))",
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
        "fill packing pays no resident cost",
        GANG,
        "if packing is Packing.FILL:",
        "if False:",
        QUALITY + "test_fill_packing_takes_the_tighter_rack_whatever_its_residents",
    ),
    Mutant(
        "fill packing gives an empty domain no worth of its own",
        GANG,
        "if free == whole and self.packing is Packing.KEEP_WHOLE:",
        "if free == whole:",
        QUALITY + "test_fill_packing_gives_an_empty_domain_no_worth_beyond_its_group_sizes",
    ),
    Mutant(
        "an InferencePool's requests carry the operator's --packing",
        REGROW,
        "        packing=cyc.packing,\n",
        "",
        REBALANCE + "test_a_pool_grows_with_the_operators_packing[fill]",
    ),
    Mutant(
        "a TrainingJob's requests carry the operator's --packing",
        TRAINING,
        "        packing=cyc.packing,\n",
        "",
        "tests/unit/test_watch_cache.py::test_admission_places_with_the_operators_packing[fill]",
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
        "the diagnosis cache is never keyed on object identity",
        GANG,
        "cache = snapshot.empty_cluster_cache",
        "cache = _if_empty.__dict__.setdefault(id(snapshot), {})",
        QUALITY + "test_diagnosis_of_one_snapshot_is_never_read_for_another",
    ),
    # preemption
    Mutant(
        "many small victims: the exact node DP decides",
        PREEMPTION,
        "        if single_node(self, relevant) and dp_steps(",
        "        if False and dp_steps(",
        OPTIMAL + "test_many_small_victims_get_the_exact_minimum",
    ),
    Mutant(
        "the node DP stays within its step bound (the greedy decides above it)",
        PREEMPTION,
        "dp_steps(self, groups, relevant) <= DP_MAX_STEPS",
        "dp_steps(self, groups, relevant) >= 0",
        PREEMPT + "test_the_node_dp_gives_way_to_the_greedy_where_its_tables_would_take_too_long",
    ),
    Mutant(
        "the node DP's ties go to the lower priority",
        PREEMPTION_DP,
        "self.victim_unit + (victim.gang.priority - self.low) * gpus",
        "self.victim_unit",
        PREEMPT + "test_equal_cost_goes_to_the_lower_priority_whatever_the_names[True]",
    ),
    Mutant(
        "the node DP's cost counts victims (fewest victims among the cheapest plans)",
        PREEMPTION_DP,
        "gpus * self.gpu_unit + self.victim_unit + (",
        "gpus * self.gpu_unit + (",
        OPTIMAL + "test_many_small_victims_get_the_exact_minimum",
    ),
    Mutant(
        "room beyond the shortfall is worth nothing",
        PREEMPTION,
        "value = float(target) - now",
        "value = float(groups) - now",
        PREEMPT + "test_room_beyond_the_shortfall_is_worth_nothing",
    ),
    Mutant(
        # Scored pod by pod (the releases stay summed per node, so plans stay valid): the exact
        # search and the improvement pass's fallback recover small cases, the heuristic at large
        # does not.
        "a victim's pods on one node count together",
        PREEMPTION,
        "                for name, g in per_node.items():\n                    # One lookup",
        "                for name, g in replica:  # each pod alone\n                    # One lookup",
        OPTIMAL + "test_heuristic_alone_stays_close_to_the_minimum",
    ),
    Mutant(
        "ties go to more finished groups (fewer victims)",
        PREEMPTION,
        "key = (-round(value / m.cost, 12), -whole, -m.cost,",
        "key = (-round(value / m.cost, 12), whole, -m.cost,",
        PREEMPT + "test_ties_go_to_fewer_victims",
    ),
    Mutant(
        "the greedy's ties go to the lower priority",
        PREEMPTION,
        "-m.cost, gang.priority, gang.name)",
        "-m.cost, -gang.priority, gang.name)",
        PREEMPT + "test_equal_cost_goes_to_the_lower_priority_whatever_the_names[False]",
    ),
    Mutant(
        "partial credit leads evictions into one domain",
        PREEMPTION,
        "_PARTIAL_CREDIT = 0.5",
        "_PARTIAL_CREDIT = 0.0",
        PREEMPT + "test_partial_progress_concentrates_evictions_on_one_domain",
    ),
    Mutant(
        "the plan gives back what it can do without",
        PREEMPTION,
        "    def _prune(self, st: _State, levels: list[int], target: int) -> None:\n",
        "    def _prune(self, st: _State, levels: list[int], target: int) -> None:\n        return\n",
        PREEMPT + "test_gives_back_what_the_plan_can_do_without",
    ),
    Mutant(
        "the prune pass gives back the larger victim first",
        PREEMPTION,
        "key=lambda v: (-self.victims[v].cost[levels[v]], -self.victims[v].gang.priority, v),",
        "key=lambda v: (self.victims[v].cost[levels[v]], -self.victims[v].gang.priority, v),",
        PREEMPT + "test_the_prune_pass_gives_back_the_larger_victim_first",
    ),
    Mutant(
        "the prune pass gives back the higher priority first among equal costs",
        PREEMPTION,
        "key=lambda v: (-self.victims[v].cost[levels[v]], -self.victims[v].gang.priority, v),",
        "key=lambda v: (-self.victims[v].cost[levels[v]], self.victims[v].gang.priority, v),",
        PREEMPT + "test_the_prune_pass_gives_back_the_higher_priority_victim_first",
    ),
    Mutant(
        "the improvement pass replaces expensive victims",
        PREEMPTION,
        "for v in order[: _IMPROVE_ATTEMPTS if everyone else _IMPROVE_ATTEMPTS_NEIGHBOURS]:",
        "for v in order[:0]:",
        OPTIMAL + "test_the_improvement_pass_brings_the_heuristic_to_the_minimum_almost_always",
    ),
    Mutant(
        "the exact search: fewest victims among the fewest GPUs",
        PREEMPTION,
        "nvict + (level > 0)",
        "0",
        PREEMPT + "test_frees_one_whole_rack_rather_than_scattering",
    ),
    Mutant(
        "the exact search: victims before priority",
        PREEMPTION,
        "if (gpus, nvict, prio) < best_obj:",
        "if (gpus, prio, nvict) < (best_obj[0], best_obj[2], best_obj[1]):",
        PREEMPT + "test_fewer_victims_before_lower_priority_among_the_cheapest_plans[exact search]",
        more=(
            ("if (gpus + suffix_min[k], nvict + 1) > best_obj[:2]:", "if gpus + suffix_min[k] > best_obj[0]:"),
            (
                "if level == lim or (gpus + victim.cost[level + 1], nvict + 1) > best_obj[:2]:",
                "if level == lim or gpus + victim.cost[level + 1] > best_obj[0]:",
            ),
        ),
    ),
    Mutant(
        "the improvement pass: victims before priority",
        PREEMPTION,
        "if objective < best:",
        "if (objective[0], objective[2], objective[1]) < (best[0], best[2], best[1]):",
        PREEMPT + "test_fewer_victims_before_lower_priority_among_the_cheapest_plans[heuristic alone]",
    ),
    Mutant(
        "the improvement pass from neighbours, as on large clusters",
        PREEMPTION,
        "_IMPROVE_ATTEMPTS_NEIGHBOURS = 8",
        "_IMPROVE_ATTEMPTS_NEIGHBOURS = 0",
        OPTIMAL + "test_the_improvement_pass_from_neighbours_alone_still_lifts_the_heuristic",
    ),
    Mutant(
        "the exact search: lowest priority among equals",
        PREEMPTION,
        "prio + victim.gang.priority * cost",
        "prio - victim.gang.priority * cost",
        PREEMPT + "test_prefers_lowest_priority_victim",
    ),
    Mutant(
        "elastic gangs shrink by whole replicas before being suspended",
        PREEMPTION,
        "self.shrinkable = shrinkable = min(max(n - gang.min_replicas, 0), n) if gang.min_replicas is not None else 0",
        "self.shrinkable = shrinkable = 0",
        PREEMPT + "test_elastic_job_shrinks_by_whole_replicas_before_anyone_is_suspended",
    ),
    # defragmentation
    Mutant(
        "defrag: fewest moves first",
        DEFRAG,
        "for k in range(1, min(len(gangs), self.max_moves) + 1):",
        "for k in range(min(len(gangs), self.max_moves), 0, -1):",
        DEFRAGS + "test_fewest_moves_before_fewest_gpus",
    ),
    Mutant(
        "defrag: fewest GPUs among equally few moves",
        DEFRAG,
        "sets.sort(key=lambda t: (t[0], [(o.gang, o.level) for o in t[1]]))",
        "sets.sort(key=lambda t: (-t[0], [(o.gang, o.level) for o in t[1]]))",
        DEFRAGS + "test_fewest_gpus_among_equally_few_moves",
    ),
    Mutant(
        "defrag: an elastic gang gives back only the replicas in the way",
        DEFRAG,
        "levels.add(level)  # the fewest that clear the gang off this supernode",
        "pass",
        DEFRAGS + "test_an_elastic_gang_gives_back_the_replica_that_shares_a_rack_with_another_move",
    ),
    Mutant(
        "defrag: the greedy ranks racks by fewest moves",
        DEFRAG,
        "ranked.append(((len(clearing), sum(o.gpus for o in clearing)), sn, clearing))",
        "ranked.append(((sum(o.gpus for o in clearing), len(clearing)), sn, clearing))",
        DEFRAGS + "test_greedy_alone_clears_the_rack_with_fewest_moves",
    ),
    Mutant(
        "defrag: the greedy gives back moves it can do without",
        DEFRAG,
        "for o in sorted(chosen, key=lambda o: -o.gpus):  # give back",
        "for o in []:  # give back",
        DEFRAGS + "test_greedy_gives_back_a_move_the_plan_can_do_without",
    ),
    Mutant(
        "defrag: the greedy gives back the larger move first",
        DEFRAG,
        "for o in sorted(chosen, key=lambda o: -o.gpus):  # give back",
        "for o in sorted(chosen, key=lambda o: o.gpus):  # give back",
        DEFRAGS + "test_greedy_gives_back_the_larger_of_two_moves_it_can_do_without",
    ),
    Mutant(
        "defrag: the greedy's cap on moves",
        DEFRAG,
        "if len(chosen) > self.max_moves or",
        "if False or",
        DEFRAGS + "test_the_greedy_moves_no_more_gangs_than_the_cap",
    ),
    Mutant(
        "defrag: the greedy may go past the cap before giving moves back",
        DEFRAG,
        "len(chosen) >= 2 * self.max_moves:",
        "len(chosen) >= self.max_moves:",
        DEFRAGS + "test_the_greedy_may_go_past_the_cap_before_giving_moves_back",
    ),
    Mutant(
        "defrag: the greedy checks the cap after giving moves back",
        DEFRAG,
        "        plan = self.verify(chosen)\n",
        "        if len(chosen) > self.max_moves:\n            return None\n        plan = self.verify(chosen)\n",
        DEFRAGS + "test_the_greedy_checks_the_cap_after_giving_moves_back",
    ),
    Mutant(
        "defrag: the greedy checks the budget after giving moves back",
        DEFRAG,
        "        plan = self.verify(chosen)\n",
        "        if sum(o.gpus for o in chosen) > (self.budget or 10**9):\n            return None\n"
        "        plan = self.verify(chosen)\n",
        DEFRAGS + "test_the_greedy_checks_the_budget_after_giving_moves_back",
    ),
    Mutant(
        "defrag: the exact search's cap on moves",
        DEFRAG,
        "for k in range(1, min(len(gangs), self.max_moves) + 1):",
        "for k in range(1, len(gangs) + 1):",
        DEFRAGS + "test_the_exact_search_moves_no_more_gangs_than_the_cap",
    ),
    Mutant(
        "defrag: the cap grows to twice the groups missing",
        DEFRAG,
        "return max(MAX_MOVES, 2 * (request.groups - groups_fitting_now))",
        "return MAX_MOVES",
        DEFRAGS + "test_the_cap_is_twice_the_groups_missing_when_that_is_more[greedy alone]",
    ),
    Mutant(
        "defrag: the greedy keeps within the budget",
        DEFRAG,
        "if len(chosen) > self.max_moves or (self.budget is not None and plan.moved_gpus > self.budget):",
        "if len(chosen) > self.max_moves:",
        DEFRAGS + "test_the_greedy_checks_the_budget_after_giving_moves_back",
        safe=False,
    ),
    Mutant(
        "defrag: moved work must fit again",
        DEFRAG,
        "if not isinstance(again, PlacementPlan):\n                        return None",
        "if not isinstance(again, PlacementPlan):\n"
        "                        again = PlacementPlan(self._replacement(o), ())  # as if placed, with no nodes",
        DEFRAGS + "test_nothing_when_moved_work_cannot_fit_again",
        safe=False,
    ),
    Mutant(
        "defrag: never below an elastic gang's minimum replicas",
        DEFRAG,
        "for level in range(1, max(n - (m.gang.min_replicas or 0), 0) + 1):",
        "for level in range(1, n + 1):",
        DEFRAGS + "test_an_elastic_gang_is_never_shrunk_below_its_minimum",
        safe=False,
    ),
    Mutant(
        "stranded GPUs: free GPUs no pending size can use",
        DEFRAG,
        "total += stranded_gpus(free, sizes)",
        "total += free",
        DEFRAGS + "test_stranded_gpus_count_what_no_pending_size_can_use",
    ),
    Mutant(
        "an elastic gang gives back just the replicas a group needs",
        DEFRAG,
        "if PARTIAL_SHRINKS and sn not in gained and self._groups_with(sn, released[sn]) > base[sn]:",
        "if False:",
        DEFRAGS + "test_an_elastic_gang_gives_back_just_the_replicas_a_group_needs",
    ),
    # defragmentation in the operator: a mover's way back (k8s/return_rooms.py)
    Mutant(
        "a mover's room is booked while it leaves",
        ROOMS,
        "        if more > 0:",
        "        if more > 0 and False:",
        MOVES + "test_a_mover_goes_back_to_its_room_though_a_later_job_would_take_it",
    ),
    Mutant(
        "a mover takes its room as it was verified",
        ROOMS,
        "plan = plan_on(cyc.snapshot, request, room.groups) if request is not None else None",
        "plan = None",
        MOVES + "test_a_restarted_operator_keeps_a_movers_room",
    ),
    Mutant(
        "a room is topped up as the work on it leaves",
        ROOMS,
        "    if room is None:\n        room = _room_of(view, status)",
        "    if room is not None:\n        return\n    if room is None:\n        room = _room_of(view, status)",
        ROOM_TESTS + "test_a_room_is_booked_as_the_work_on_it_leaves",
    ),
    Mutant(
        "a called-off move frees its room at once",
        ROOMS,
        "        _free(cyc, cyc.return_rooms.pop(uid))",
        "        cyc.return_rooms.pop(uid)",
        MOVES + "test_a_called_off_move_frees_its_room_in_the_same_cycle",
    ),
    Mutant(
        "a room is booked whatever the node's taints",
        ROOMS,
        "min(gpus - booked[name], node.gpus - node.allocated)",
        "min(gpus - booked[name], node.free)",
        MOVES + "test_a_room_on_tainted_nodes_the_mover_tolerates_is_kept_from_others_who_do",
    ),
    Mutant(
        "plans that count leaving work as gone see the whole room",
        ROOMS,
        "        _book(scratch, room.wanted, Counter(room.booked))",
        "        pass",
        ROOM_TESTS + "test_the_rest_of_a_room_is_booked_in_the_copy_that_counts_leaving_work_free",
    ),
    Mutant(
        "a room not taken when its move ends is freed",
        ROOMS,
        "        if not room.taking:\n            continue",
        "        if True:\n            continue",
        ROOM_TESTS + "test_a_room_not_taken_in_the_cycle_its_move_ended_is_freed_at_the_end",
    ),
    Mutant(
        "given-back replicas grow back onto their room",
        REGROW,
        "plan = take_return_room(cyc, view.uid, request)",
        "plan = take_return_room(cyc, view.uid, None)",
        MOVES + "test_given_back_replicas_grow_back_onto_their_room[False]",
    ),
    # preemption within a namespace's quota
    Mutant(
        "quota victims: the fewest GPUs before the fewest victims",
        QUOTA,
        "key=lambda item: (item[0], item[1][0], item[1][1])",
        "key=lambda item: (item[1][0], item[0], item[1][1])",
        QUOTA_TESTS + "test_the_fewest_gpus_win_over_the_lowest_priority",
    ),
    Mutant(
        "quota victims: an elastic gang shrinks rather than goes whole",
        QUOTA,
        "    if gang.min_replicas is not None:",
        "    if False:",
        QUOTA_TESTS + "test_an_elastic_gang_gives_back_its_top_replicas_down_to_its_minimum",
    ),
    Mutant(
        "quota victims: fewer victims, then lower priorities, at equal GPUs",
        QUOTA,
        "if held is None or (victims, priorities) < held[:2]:",
        "if held is None or (victims, priorities) > held[:2]:",
        QUOTA_TESTS + "test_fewer_victims_win_at_equal_gpus_then_lower_priorities",
    ),
    Mutant(
        "a room keeps its mover's quota share",
        ROOMS,
        "        if room.taking and item is not None:",
        "        if False:",
        MOVES + "test_a_room_keeps_its_movers_quota_share_from_a_job_queued_before_it",
    ),
    Mutant(
        "GPUs that left for the job lately count as gone while the quota's status still counts them",
        ADMISSION,
        '                departed[cyc.quotas.class_of(other)] += int(last.get("gpus") or 0)',
        "                departed[cyc.quotas.class_of(other)] += 0",
        TENANCY + "test_a_victims_pods_still_counted_by_the_quota_evict_nobody_else_and_the_job_keeps_its_nodes",
    ),
    Mutant(
        "quota victims' GPUs are planned as freed for the job's placement",
        ADMISSION,
        "result = with_released(scratch, dict(released), lambda: plan_preemption(scratch, request, others))",
        "result = plan_preemption(scratch, request, others)",
        TENANCY + "test_quota_victims_whose_gpus_the_job_needs_in_a_full_cluster_are_planned_as_freed",
    ),
    Mutant(
        "a victim need count only under the quotas that are short",
        QUOTAS,
        "            if over > 0:",
        "            if True:",
        TENANCY + "test_a_quota_that_is_not_short_does_not_keep_a_victim_from_being_counted",
    ),
    Mutant(
        "a room's quota share counts inside the max with the quota's status.used, never twice",
        QUOTAS,
        "return max(counted, reported) - own + _scoped(",
        "return max(counted - own, reported) + _scoped(",
        MOVES + "test_a_room_keeps_its_movers_quota_share_from_a_job_queued_before_it",
    ),
    Mutant(
        "GPUs leaving for a job count only under the quotas whose scope counts them",
        QUOTAS,
        "over = in_use - gone - _scoped(leaving, q) + gpus - q.hard[key]",
        "over = in_use - gone - sum((leaving or {}).values()) + gpus - q.hard[key]",
        TENANCY + "test_the_shortfall_subtracts_leaving_gpus_only_under_the_quotas_whose_scope_counts_them",
    ),
    Mutant(
        "departed GPUs count as gone for as long as the quota may count their terminating pods",
        ADMISSION,
        "    return 2 * dt.timedelta(seconds=seconds) + QUOTA_LAG",
        "    return dt.timedelta(minutes=2)",
        TENANCY + "test_a_victims_pods_still_counted_by_the_quota_evict_nobody_else_and_the_job_keeps_its_nodes",
    ),
    # checkpoint requests
    Mutant(
        "a called-off eviction another plan needs is taken over, not asked again",
        TRAINING,
        "    if called_off is not None:",
        "    if False:",
        GRACE + "test_a_called_off_preemption_a_queued_job_needs_is_taken_over_not_asked_again",
    ),
    Mutant(
        "a mover done first waits for the leaving work still on its way back",
        TRAINING,
        "        if held_by:",
        "        if False:",
        MOVES + "test_a_mover_done_first_waits_for_the_mover_still_on_its_way_back",
    ),
    Mutant(
        "a mover does not wait for a holder whose checkpoint is done",
        TRAINING,
        'if checkpoint_done(job, eviction.get("requestedAt") or "") or _deadline_passed(cyc, eviction):',
        'if False and checkpoint_done(job, eviction.get("requestedAt") or "") or _deadline_passed(cyc, eviction):',
        MOVES + "test_a_mover_waits_only_for_leaving_work_the_gang_waits_for_too[done-False]",
    ),
    Mutant(
        "a mover waits only for leaving work the gang waits for too",
        TRAINING,
        "not leaving.isdisjoint(short) and not leaving.isdisjoint(hold.nodes)",
        "not leaving.isdisjoint(short)",
        MOVES + "test_a_mover_waits_only_for_leaving_work_the_gang_waits_for_too[not on the gang's nodes-False]",
    ),
    # the disruption budget (k8s/disruption_ledger.py)
    Mutant(
        "a deleted job's evictions of the hour still count against the budget",
        REGROW,
        "used = cyc.deleted_disruption_gpus",
        "used = 0",
        DELETED_JOB_BUDGET + "[once suspended]",
    ),
    Mutant(
        "a restarted operator reads the ledger back",
        LEDGER,
        "                self.ledger.merge(data, now)\n",
        "",
        DELETED_JOB_BUDGET + "[once suspended]",
    ),
    Mutant(
        "a job already handed over adds nothing from an older view",
        LEDGER,
        "        if any(r.job == view.uid for r in self.records):\n            return\n",
        "",
        REBALANCE + "test_a_standby_that_takes_over_counts_what_the_other_replica_saved_once_and_keeps_it",
    ),
    Mutant(
        "the ledger is read again after a pause between cycles",
        LEDGER,
        "return self.last_cycle is None or now - self.last_cycle > PAUSE",
        "return self.last_cycle is None",
        LEDGER_TESTS + "test_the_configmap_is_read_again_after_a_pause_or_periodically[after a pause]",
    ),
    Mutant(
        "until the ledger is read the budget fails closed",
        LEDGER,
        "        if unknown and budget is not None:\n            return budget\n",
        "",
        LEDGER_TESTS + "test_until_the_configmap_is_read_the_budget_counts_as_used_up_for_at_most_an_hour",
    ),
    Mutant(
        "an eviction under way when its job is deleted counts as taken",
        LEDGER,
        "self._add(LedgerRecord(view.uid, now, leaving_disruption_gpus(view, status)))",
        "pass",
        DELETED_JOB_BUDGET + "[while checkpointing]",
    ),
    # a control-plane outage (k8s/outage.py)
    Mutant(
        "most nodes NotReady at once restart no gang group",
        TRAINING,
        "elif not node_view.ready and cyc.not_ready_failed(node):",
        "elif not node_view.ready:",
        MASS_NOT_READY,
    ),
    Mutant(
        "more than 2 NotReady nodes wait the grace (an outage may still be spreading)",
        OUTAGE,
        "failed = frozenset(n for n, t in self.since.items() if now - t >= self.grace)",
        "failed = frozenset(self.since)",
        RACK_NOT_READY,
    ),
    Mutant(
        "a node whose grace ends is reconciled though nothing about it changed",
        CONTROLLER,
        "moved = self.keeper.jobs_on(dirty_nodes | failed_now)",
        "moved = self.keeper.jobs_on(dirty_nodes)",
        RACK_NOT_READY,
    ),
    Mutant(
        "the nodes not back when an outage ends get the grace from then",
        OUTAGE,
        "            self.since = dict.fromkeys(self.since, now)\n",
        "            pass\n",
        MASS_NOT_READY,
    ),
    Mutant(
        "while an outage ends even the last one or two NotReady nodes wait the grace",
        OUTAGE,
        "elif len(self.since) <= FEW and now >= self.settling_until:",
        "elif len(self.since) <= FEW:",
        MASS_NOT_READY,
    ),
    Mutant(
        "after more than 2 were NotReady the last stragglers wait the grace too",
        OUTAGE,
        "if was or self.mass or len(self.since) > FEW:",
        "if was:",
        FAILURES + "test_after_more_than_2_were_not_ready_the_last_stragglers_wait_the_grace_too",
    ),
    Mutant(
        "only the Supernodes' members count",
        CONTROLLER,
        "watched = [n for n in self.cache.not_ready if n in member_nodes and n not in repair]",
        "watched = [n for n in self.cache.not_ready if n not in repair]",
        FAILURES + "test_only_the_supernodes_members_not_down_for_repair_count",
    ),
    Mutant(
        "nodes down for repair do not count",
        OUTAGE,
        "return not node.ready and (node.unschedulable or out_of_service(node.taints))",
        "return False",
        FAILURES + "test_only_the_supernodes_members_not_down_for_repair_count",
    ),
    Mutant(
        "while an outage's nodes keep coming back the rest wait",
        OUTAGE,
        "if self.recovering and (was or len(self.since) < self.last_count):",
        "if was and not self.mass:",
        FAILURES + "test_a_slow_recovery_from_an_outage_restarts_nothing_while_nodes_keep_coming_back",
    ),
    Mutant(
        "failures while a node of the job is held NotReady are not charged",
        TRAINING,
        "    if own and (not restarting or own & restarting) and not _held_not_ready(cyc, status):\n",
        "    if own and (not restarting or own & restarting):\n",
        FAILURES + "test_failures_while_a_node_of_the_job_is_held_not_ready_are_not_charged",
    ),
    Mutant(
        "a NotReady node outside every Supernode is a failed machine (not held)",
        CONTROLLER,
        "        self.failed_not_ready = self.not_ready.failed | repair | outside\n",
        "        self.failed_not_ready = self.not_ready.failed | repair\n",
        FAILURES + "test_a_not_ready_node_outside_every_supernode_still_has_its_groups_placed_again",
    ),
    Mutant(
        "tidal's pods tolerate a lost node without a time limit (no 300 s eviction mid-outage)",
        MANIFESTS,
        '            spec["tolerations"].append({"key": taint.key, "operator": "Exists", "effect": taint.effect})\n',
        "            pass\n",
        LOST_NODE_TOLERATION,
    ),
    Mutant(
        "a template's own toleration of a lost node is kept, not doubled",
        MANIFESTS,
        "        if not any(t.tolerates(taint) for t in own):\n",
        "        if True:\n",
        LOST_NODE_TOLERATION,
    ),
    # the tide: resize costs, flaps, demand as observed, tidal's admission and grow-back
    Mutant(
        "a Restart shrink dearer than a suspension gives way to it",
        CAPACITY,
        "    if not any(_restart_shrink(e, gangs) for e in plan.evictions):",
        "    if True:",
        COST_TESTS + "test_a_restart_shrink_dearer_than_a_suspension_gives_way_to_it",
    ),
    Mutant(
        "a cheaper plan suspends no higher priority",
        CAPACITY,
        "        and _suspended_tier(other, gangs) <= _tier_allowed(plan, gangs)\n",
        "        and True\n",
        COST_TESTS + "test_a_cheaper_plan_never_suspends_a_higher_priority_than_the_first_one",
    ),
    Mutant(
        "a Live shrink stalls only the survivors' rebuild",
        RESIZE_COST,
        "            return staying * self.rebuild_s",
        "            return staying * self.restore_seconds(model_gpus, staying)",
        COST_TESTS
        + "test_a_live_shrink_costs_the_survivors_rebuild_and_a_restart_shrink_the_whole_jobs_save_and_reload",
    ),
    Mutant(
        "tidal's grow-back cooldown runs from the shrink's decision",
        SIM_POLICIES,
        "                self.shrunk_at[job.id] = sim.now\n",
        "                self.shrunk_at[job.id] = sim.now + 60  # as if stamped at the save, minutes on\n",
        TIDE + "test_tidals_grow_back_cooldown_runs_from_the_shrinks_decision_like_the_flap_count",
    ),
    Mutant(
        "a flap counts from the eviction's decision",
        ENGINE,
        "        if job.down_decided_at is not None and self.now - job.down_decided_at < FLAP_WINDOW_S:",
        "        if job.down_at is not None and self.now - job.down_at < FLAP_WINDOW_S:",
        TIDE + "test_a_flap_is_counted_from_the_evictions_decision[3600.0-0]",
    ),
    Mutant(
        "a replica added and removed within the hour is a flap",
        ENGINE,
        "            if self.now - replicas[i].added_at < FLAP_WINDOW_S:",
        "            if False:",
        TIDE + "test_an_inference_replica_added_and_removed_within_the_hour_is_a_flap",
    ),
    Mutant(
        "a Live shrink writes no checkpoint",
        ENGINE,
        '        if replicas and len(replicas) < job.dp and job.resize == ResizeKind.LIVE and job.state == "running":',
        "        if False:",
        TIDE + "test_a_live_shrink_writes_nothing_frees_the_gpus_at_once_and_stalls_the_survivors_for_a_rebuild",
    ),
    Mutant(
        "a Live grow-back trains on while the new replicas join",
        ENGINE,
        '        if job.resize == ResizeKind.LIVE and job.state == "running":\n            self.totals.live_grow_backs',
        "        if False:\n            self.totals.live_grow_backs",
        TIDE + "test_a_live_grow_trains_on_while_the_new_replica_joins_then_rebuilds_once",
    ),
    Mutant(
        "a policy sees only the last minute",
        ENGINE,
        "        start = max(self.now - METRIC_WINDOW_S, 0.0)",
        "        start = self.now",
        TIDE + "test_a_policy_sees_only_the_last_minute",
    ),
    Mutant(
        "a job never started counts its wait to the horizon",
        ENGINE,
        "if j.first_start is None and j.arrival.at < self.end",
        "if False",
        TIDE + "test_a_job_never_started_counts_its_wait_up_to_the_horizon",
    ),
    Mutant(
        "tidal-whole starts no job smaller",
        SIM_POLICIES,
        "    whole_starts_only = True\n",
        "    whole_starts_only = False\n",
        TIDE + "test_tidal_whole_starts_no_job_smaller",
    ),
    Mutant(
        "the room a Live shrink frees goes to the pool first",
        SIM_POLICIES,
        "            self.place_free(sim, pool, target - len(pool.replicas))",
        "            pass",
        TIDE + "test_the_room_a_live_shrink_frees_goes_to_the_pool_before_queued_training",
    ),
    Mutant(
        "a job still joining is not grown again",
        SIM_POLICIES,
        "            and not j.joining_gpus\n",
        "",
        TIDE + "test_a_jobs_live_replicas_still_joining_are_not_grown_again_and_a_shrink_waits_for_them",
    ),
    Mutant(
        "every size a grow-back tries must pay",
        SIM_POLICIES,
        "            if not self.grow_pays(sim, job, missing * replica_gpus, room):\n                missing //= 2",
        "            if not self.grow_pays(sim, job, missing * replica_gpus, room):\n                return 0",
        TIDE + "test_a_grow_back_checks_that_each_size_it_tries_pays",
    ),
    Mutant(
        "the forecast reads the previous days only",
        SIM_POLICIES,
        "at - d * 86400) for d in range(1, days + 1)",
        "at - (d - 1) * 86400) for d in range(1, days + 1)",
        TIDE + "test_no_policy_reads_the_present_or_the_future[tidal]",
    ),
    Mutant(
        "a Live shrink during a join waits for it",
        ENGINE,
        "        joining = max(job.join_end - self.now, 0.0) if job.joining_gpus else 0.0",
        "        joining = 0.0",
        TIDE + "test_a_jobs_live_replicas_still_joining_are_not_grown_again_and_a_shrink_waits_for_them",
    ),
    Mutant(
        "GPUs still joining count as stalled",
        ENGINE,
        "            else:\n                stalled += job.joining_gpus",
        "            else:\n                pass",
        TIDE + "test_a_live_grow_trains_on_while_the_new_replica_joins_then_rebuilds_once",
    ),
    Mutant(
        "a cheaper plan suspends no higher than the first one suspends",
        CAPACITY,
        "    if any(e.whole for e in plan.evictions):\n        return _suspended_tier(plan, gangs)",
        "    if any(e.whole for e in plan.evictions):\n        return 2**31",
        COST_TESTS + "test_a_cheaper_plan_never_suspends_above_what_the_first_plan_suspends",
    ),
    Mutant(
        "a grow-back pays for the shrink that gives its GPUs back",
        RESIZE_COST,
        "        if shrunk_again:\n            cost +=",
        "        if False:\n            cost +=",
        COST_TESTS + "test_a_grow_back_the_forecast_will_want_back_pays_for_that_shrink_too",
    ),
    Mutant(
        "a grow-back must pay for its stall",
        SIM_POLICIES,
        "            if not self.grow_pays(sim, job, missing * replica_gpus, room):\n                missing //= 2",
        "            if False:\n                missing //= 2",
        TIDE + "test_a_grow_back_that_would_stall_more_than_it_gains_is_not_made",
    ),
    Mutant(
        "a grow-back does not read the job's end (the operator cannot)",
        SIM_POLICIES,
        "job.model_gpus, calm, shrunk_again=calm < GROW_HORIZON_S",
        "job.model_gpus, min(calm, job.remaining / max(job.rate, 1e-9)), shrunk_again=calm < GROW_HORIZON_S",
        TIDE + "test_a_grow_back_does_not_know_when_the_job_ends",
    ),
    Mutant(
        "a pool waits only for the victims it asked to save",
        SIM_POLICIES,
        "        return bool(victims)",
        '        return bool(victims) or any(j.state == "checkpointing" for j in sim.active.values())',
        TIDE + "test_a_pool_waits_only_for_the_victims_it_asked_to_save",
    ),
    Mutant(
        "a Live rebuild keeps the periodic-checkpoint cadence",
        ENGINE,
        "job.clock_kept = live and (",
        "job.clock_kept = False and (",
        TIDE + "test_after_a_live_rebuild_the_work_since_the_last_save_is_still_at_risk",
    ),
    Mutant(
        "the forecast looks as far ahead as making room takes",
        SIM_POLICIES,
        "        return sim.costs.room_lead_s(SYNC_S, sim.costs.cold_start_s)",
        "        return 3600.0",
        TIDE + "test_the_forecast_lead_is_the_time_making_room_takes",
    ),
    Mutant(
        "tidal-burst keeps warm replicas ahead of observed bursts",
        SIM_POLICIES,
        "            desired = max(desired, self.bursts.ahead(pool.name, self.burst_quantile))",
        "            pass",
        TIDE + "test_tidal_burst_keeps_warm_replicas_ahead_of_the_bursts_it_has_seen",
    ),
    # node loss (issue 34): a lost node's pods go by force in the cycle that sees it
    Mutant(
        "a pod deleted with a grace period is forced once its node runs nothing",
        CYCLE,
        "if pod.deletion_grace == 0 or pod.uid in self.forced_uids:",
        "if pod.terminating or pod.uid in self.forced_uids:",
        CHECKS + "test_a_pod_deleted_with_a_grace_period_is_forced_once_its_node_is_fenced",
    ),
    Mutant(
        "every cycle forces the pods of lost nodes, whichever decision deleted them",
        CONTROLLER,
        "        cyc.delete_lost_pods()",
        "        pass",
        CHECKS + "test_a_deleted_job_s_pod_on_a_lost_node_is_forced_though_no_decision_deletes_it",
    ),
    Mutant(
        "a delete's grace period travels in its body beside the uid precondition",
        API,
        "body = client.V1DeleteOptions(preconditions=preconditions, grace_period_seconds=grace_seconds)",
        "body = client.V1DeleteOptions(preconditions=preconditions)",
        "tests/unit/test_api_retry.py::test_a_forced_delete_sends_its_grace_period_in_the_body_beside_the_uid_precondition",
    ),
    # the operator's grow-back weighs its cost (issue 33)
    Mutant(
        "the operator grows back only when the added replicas' work pays for the restarts",
        REGROW,
        "if not _grow_pays(cyc, view, shape, bigger, pools or {}):",
        "if False:",
        REBALANCE + "test_a_grow_back_that_the_schedule_would_take_back_before_it_pays_waits",
    ),
    Mutant(
        "a floor unmet now is today's shortfall, not the schedule's coming rise",
        DEMAND,
        "base = [max(pool.placed, floor_at(pool, now)) for pool in pools]",
        "base = [pool.placed for pool in pools]",
        REBALANCE + "test_a_pool_nothing_is_being_freed_for_holds_no_training_back_from_growing",
    ),
    # Live resize (issue 35)
    Mutant(
        "a Live job's shrink asks for no checkpoint",
        TRAINING,
        "if replicas and live_resize.resize_kind(view) == ResizeKind.LIVE:",
        "if False:",
        "tests/unit/test_live_resize.py::test_a_live_shrink_announces_a_generation_and_deletes_the_leavers_once_every_survivor_acknowledges",
    ),
    Mutant(
        "the leaving pods wait for every survivor's acknowledgement",
        LIVE,
        "if not leaving and not acknowledged(pod, generation):",
        "if False:",
        "tests/unit/test_live_resize.py::test_a_live_shrink_announces_a_generation_and_deletes_the_leavers_once_every_survivor_acknowledges",
    ),
    Mutant(
        "a Live shrink without every acknowledgement falls back to checkpoint-first",
        TRAINING,
        "if live_resize.timed_out(cyc, eviction):",
        "if False:",
        "tests/unit/test_live_resize.py::test_a_live_shrink_nobody_acknowledges_falls_back_to_checkpoint_first_after_the_timeout",
    ),
    Mutant(
        "a finished Live shrink's generation is the job's",
        TRAINING,
        'out["worldGeneration"] = max(int(out.get("worldGeneration") or 0), int(eviction["generation"]))',
        "pass",
        "tests/unit/test_live_resize.py::test_a_finished_live_shrinks_generation_is_the_jobs_though_the_status_lost_it",
    ),
    Mutant(
        "a job that holds nothing has nobody joining",
        TRAINING,
        '            "worldJoining",  # a whole restart loads the checkpoint: nobody joins (the generation stays)\n',
        "",
        "tests/unit/test_live_resize.py::test_a_job_that_holds_nothing_has_nobody_joining_but_keeps_its_generation",
    ),
    Mutant(
        "a new generation is above every one a pod shows or acknowledged",
        LIVE,
        "                shown.append(int(value))\n",
        "                pass\n",
        "tests/unit/test_live_resize.py::test_a_new_generation_is_above_every_one_a_pod_shows_or_acknowledged",
    ),
    # training preemption in the simulator (issue 33, point 5)
    Mutant(
        "tidal's training preemption is checkpoint-first",
        SIM_POLICIES,
        "sim.request_checkpoint(victim, () if eviction.whole else eviction.replicas)",
        "sim.kill(victim)",
        TIDE + "test_tidal_preempts_training_for_training_as_the_operator_does_shrinking_after_a_checkpoint[Tidal]",
    ),
    Mutant(
        "queued training preempts lower-priority training when the scenario says so",
        SIM_POLICIES,
        "        if self.training_preemption:\n            self.preempt_for_waiting(sim)\n",
        "",
        TIDE + "test_autoscale_preempt_kills_a_whole_lower_priority_gang_and_starts_the_job_at_once",
    ),
    Mutant(
        "the room a preemption frees is held for its job",
        SIM_POLICIES,
        "            sim.hold(job_id, room.nodes)\n",
        "",
        TIDE + "test_the_room_a_preemption_makes_is_held_for_its_job_until_the_last_victim_is_gone",
    ),
    Mutant(
        "a scenario hands its training preemption to the policy",
        SIM_RUN,
        "    policy.training_preemption = scenario.training_preemption\n",
        "",
        TIDE + "test_a_scenario_hands_its_training_preemption_to_the_policy",
    ),
    # the watch cache (issue 34): a pod's late deletion never drops its successor
    Mutant(
        "a late deletion leaves the pod that holds the name now",
        WATCH,
        "if held is not None and held.uid != last.uid:",
        "if False:",
        "tests/unit/test_watch_cache.py::test_a_pods_deletion_handled_after_its_successor_under_the_name_keeps_the_successor",
    ),
    Mutant(
        "a late update of a deleted pod does not bring it back",
        WATCH,
        "if view is not None and self._deleted_uids.get(key) == view.uid:",
        "if False:",
        "tests/unit/test_watch_cache.py::test_a_pods_deletion_handled_after_its_successor_under_the_name_keeps_the_successor",
    ),
    Mutant(
        "an old pod's late update never replaces the live pod of its name",
        WATCH,
        "if view.terminating and not held.terminating:",
        "if False:",
        "tests/unit/test_watch_cache.py::test_a_pods_deletion_handled_after_its_successor_under_the_name_keeps_the_successor",
    ),
    Mutant(
        "an announced Live shrink is never called off, even fallen back",
        TRAINING,
        'unwanted = None if eviction.get("generation") else _no_longer_wanted(cyc, eviction)',
        "unwanted = _no_longer_wanted(cyc, eviction)",
        "tests/unit/test_live_resize.py::test_a_fallen_back_live_shrink_is_carried_out_though_its_pool_no_longer_wants_the_room",
    ),
    Mutant(
        "a Live grow-back tells the new replicas they join",
        LIVE,
        '"worldJoining": list(range(shape.dp, bigger.dp)),',
        '"worldJoining": [],',
        "tests/unit/test_live_resize.py::test_a_live_grow_back_is_a_new_generation_whose_new_replicas_know_they_join",
    ),
    # issue 34's leftovers, each pinned
    Mutant(
        "a pool's invalid spec (an unknown timezone) is named in its status",
        REGROW,
        '        new = {**status, "reason": problem, "conditions": conditions}',
        '        new = {**status, "conditions": conditions}',
        REBALANCE + "test_an_unknown_timezone_is_named_in_the_pools_status_with_the_nearest_valid_zones",
    ),
    Mutant(
        "a delete refused by its uid precondition (409) counts as done",
        API,
        "if e.status not in (404, 409):",
        "if e.status not in (404,):",
        "tests/unit/test_api_retry.py::test_a_delete_refused_by_its_uid_precondition_counts_as_done_and_other_refusals_do_not",
    ),
    Mutant(
        "a pod delete carries the uid the cycle saw",
        WRITE,
        "api.delete_pod(d.namespace, d.name, d.grace_seconds, d.uid)",
        "api.delete_pod(d.namespace, d.name, d.grace_seconds)",
        "tests/unit/test_write.py::test_a_pod_delete_goes_out_with_its_grace_and_the_uid_the_cycle_saw",
    ),
    Mutant(
        "a gate removal sent moments ago is not sent again",
        CYCLE,
        "            awaited = {n for n in gated if pods[n].uid in self.ungated_uids}\n",
        "            awaited: set[str] = set()\n",
        "tests/unit/test_gate_ledger.py::test_a_cycle_does_not_lift_again_the_gates_it_lifted_until_the_resend_interval",
    ),
    Mutant(
        "a job awaiting its gates is not settled, so they are sent again",
        CYCLE,
        "        return self.plan.pod_actions + self.gates_awaited\n",
        "        return self.plan.pod_actions\n",
        "tests/unit/test_gate_ledger.py::test_a_cycle_does_not_lift_again_the_gates_it_lifted_until_the_resend_interval",
    ),
    Mutant(
        "no cycle before the nodes' first listing",
        INFORMER,
        "return self.pods.synced.is_set() and self.nodes.synced.is_set()",
        "return self.pods.synced.is_set()",
        "tests/unit/test_handlers.py::test_no_cycle_runs_before_the_first_listing_of_pods_and_of_nodes[nodes]",
    ),
    Mutant(
        "a node event that changes nothing the cache reads still reaches discovery",
        INFORMER,
        "            elif view != held:  # an equal view (a node's heartbeat) changes nothing the cache reads\n",
        "            elif view == held:\n                return\n            else:\n",
        "tests/unit/test_informer.py::test_node_events_reach_the_cache_a_heartbeat_is_not_queued_but_the_hook_sees_it",
    ),
    Mutant(
        "discovery forgets the Supernodes the audit's LIST lacks",
        HANDLERS,
        'discovery.prune(listed["supernode"])',
        "pass",
        "tests/unit/test_handlers.py::test_a_supernode_deleted_while_its_watch_was_down_is_discovered_again",
    ),
    Mutant(
        "the audit's LIST only takes names out of what discovery knows",
        SUPERNODES,
        "self.known &= names",
        "self.known = set(names)",
        DISCOVERY_TESTS + "test_a_deletion_heard_while_the_audits_list_was_served_is_not_undone",
    ),
    Mutant(
        "a deletion heard while the seeding LIST was out is not undone by it",
        SUPERNODES,
        "self.known |= listed - self._deleted",
        "self.known |= listed",
        DISCOVERY_TESTS + "test_a_deletion_heard_while_the_seeding_list_was_out_is_not_undone",
    ),
    Mutant(
        "only the container's own process takes the pod's name as its peering identity",
        RUNNER,
        '    if "POD_ID" in env or pid != 1:\n',
        '    if "POD_ID" in env:\n',
        "tests/unit/test_peering_id.py::test_any_other_process_in_the_pod_keeps_kopfs_own_id",
    ),
    Mutant(
        "statuses, ours and read, are compared as the API server stores them (its defaults filled)",
        STATUS,
        "        stored = status_as_stored(kind, wire)\n",
        "        stored = wire\n",
        STATUS_TESTS + "test_a_field_the_api_server_defaults_inside_the_status_is_no_other_writers_change",
    ),
    Mutant(
        "the server's defaults are filled inside fields that are present, not only at the top",
        SERVER_DEFAULTS,
        "                    out[name] = with_defaults(sub, out[name])\n",
        "                    pass\n",
        DEFAULTS_TESTS + "test_defaults_fill_missing_fields_at_every_depth_and_inside_what_they_filled",
    ),
    Mutant(
        "the cycle summary is logged at most every --cycle-log-seconds",
        CYCLE_LOG,
        "        due = self._last_line is None or self.monotonic() - self._last_line >= self.every_seconds\n",
        "        due = True\n",
        "tests/unit/test_cycle_log.py::test_cycles_that_acted_are_summed_into_one_line_at_most_every_period",
    ),
]


@pytest.fixture(scope="module")
def pristine_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    shutil.copytree(REPO / "operator" / "tidal", root / "tidal", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(source_root: Path, *node_ids: str) -> dict[str, str]:
    """Outcome per test node id of a pytest run importing `tidal` from source_root (see tests/mutant_report.py)."""
    report = source_root / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.mutant_report", *node_ids],
        cwd=REPO,
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
            "PYTHONPATH": str(source_root),
            "PYTHONHASHSEED": "0",
            "TIDAL_MUTANT_REPORT": str(report),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.exists(), result.stdout[-2000:] + result.stderr[-2000:]
    recorded = json.loads(report.read_text())
    imported = recorded["tidal"]
    assert imported and Path(imported).is_relative_to(source_root), f"imported {imported}, not the copy"
    assert not recorded["collection_errors"], result.stdout[-2000:]
    assert recorded["exit_status"] in (0, 1), (
        f"pytest exit status {recorded['exit_status']}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )
    return recorded["outcomes"]


def _under(node_id: str, specs: tuple[str, ...]) -> bool:
    return any(node_id == s or node_id.startswith((s + "::", s + "[")) for s in specs)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.rule for m in MUTANTS])
def test_removing_the_rule_turns_its_test_red(mutant: Mutant, pristine_copy: Path, tmp_path: Path) -> None:
    shutil.copytree(pristine_copy / "tidal", tmp_path / "tidal")
    source = tmp_path / "tidal" / mutant.module
    text = source.read_text()
    for original, mutated in ((mutant.original, mutant.mutated), *mutant.more):
        assert text.count(original) == 1, f"{mutant.module} changed: rewrite the mutant for {mutant.rule!r}"
        text = text.replace(original, mutated)
    source.write_text(text)
    safety = SAFETY[mutant.module]
    outcomes = _run(tmp_path, mutant.pinned_by, *safety)
    assert outcomes.get(mutant.pinned_by) == "assertion", (
        f"{mutant.pinned_by} survives the removal of {mutant.rule!r} (or fails otherwise): {outcomes}"
    )
    safety_outcomes = {n: o for n, o in outcomes.items() if _under(n, safety)}
    for spec in safety:
        assert any(_under(n, (spec,)) for n in safety_outcomes), f"safety test {spec} did not run: {outcomes}"
    if mutant.safe:
        assert set(safety_outcomes.values()) == {"passed"}, f"the mutant breaks plans, not the rule: {outcomes}"
    else:
        assert "assertion" in safety_outcomes.values(), f"the safety tests miss a safety rule removed: {outcomes}"
    others = {n: o for n, o in outcomes.items() if n != mutant.pinned_by and n not in safety_outcomes}
    assert not others, others


def test_every_pinning_and_safety_test_passes_on_the_unmutated_copy(pristine_copy: Path) -> None:
    # Otherwise a test red for an unrelated reason (a typo in its node id included) would count as pinning.
    pinned = {m.pinned_by for m in MUTANTS}
    safety = tuple(dict.fromkeys(s for specs in SAFETY.values() for s in specs))
    outcomes = _run(pristine_copy, *sorted(pinned), *safety)
    assert pinned <= outcomes.keys(), pinned - outcomes.keys()
    for spec in safety:
        assert any(_under(n, (spec,)) for n in outcomes), f"safety test {spec} did not run"
    assert all(_under(n, safety) for n in outcomes.keys() - pinned)
    assert set(outcomes.values()) == {"passed"}, outcomes
