"""The Grafana dashboard, generated from code with grafana-foundation-sdk (`tidal dashboard`).

The JSON is checked in at charts/tidal/files/tidal-dashboard.json; a test fails when it drifts,
and a cluster test runs every panel's query against a real Prometheus scraping the operator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_PATH = Path("charts/tidal/files/tidal-dashboard.json")


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # timeseries | heatmap | stat
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    stacked: bool = False


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Free GPUs per supernode",
        "heatmap",
        (('sum by (supernode) (tidal_supernode_gpus{state="free"})', "{{supernode}}"),),
        description="Free accelerators of every supernode over time: where large slices remain.",
    ),
    PanelSpec(
        "GPUs by class (the tide)",
        "timeseries",
        (("sum by (class) (tidal_gpus)", "{{class}}"),),
        stacked=True,
        description="Training, inference, other, idle and failed accelerators: inference by day, training by night.",
    ),
    PanelSpec(
        "Pending jobs by reason",
        "timeseries",
        (("sum by (reason) (tidal_pending_jobs)", "{{reason}}"),),
        description="TrainingJobs waiting for GPUs and why (the Schedulable condition's reason).",
    ),
    PanelSpec("Oldest pending job", "stat", (("max(tidal_oldest_pending_seconds)", "oldest"),), unit="s"),
    PanelSpec(
        "Placement latency",
        "timeseries",
        (
            ("histogram_quantile(0.5, sum by (le) (rate(tidal_placement_duration_seconds_bucket[5m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(tidal_placement_duration_seconds_bucket[5m])))", "p99"),
        ),
        unit="s",
        description="Time to plan one gang (or one batch of inference replicas).",
    ),
    PanelSpec(
        "Preemptions and rebalance moves",
        "timeseries",
        (
            ("sum by (direction, reason) (increase(tidal_rebalance_moves_total[15m]))", "{{direction}} {{reason}}"),
            ("sum(increase(tidal_preemptions_total[15m]))", "preemptions"),
        ),
        description="Replicas and DP replicas moved between inference and training, per 15 minutes.",
    ),
    PanelSpec(
        "Checkpoint wait (p90)",
        "timeseries",
        (("histogram_quantile(0.9, sum by (le) (rate(tidal_checkpoint_wait_seconds_bucket[1h])))", "p90"),),
        unit="s",
        description="From checkpoint request to eviction.",
    ),
    PanelSpec(
        "Failures and restarts",
        "timeseries",
        (
            ('sum(tidal_supernode_gpus{state="failed"})', "failed GPUs"),
            ("sum(increase(tidal_restarts_total[15m]))", "restarts per 15m"),
            ("sum(increase(tidal_lost_pods_deleted_total[15m]))", "pods of lost nodes deleted per 15m"),
            ("max(tidal_nodes_not_ready)", "nodes NotReady"),
            ("max(tidal_mass_not_ready)", "mass NotReady (restarts held)"),
        ),
        description="GPUs on NotReady or missing nodes, workload restarts after failures, pods force-deleted "
        "from gone or fenced nodes, NotReady nodes, and 1 "
        "while most nodes are NotReady at once (a control-plane outage: NotReady alone restarts nothing).",
    ),
    PanelSpec(
        "Largest free slice per supernode",
        "timeseries",
        (("tidal_supernode_largest_free_slice_gpus", "{{supernode}}"),),
        description="The biggest HBD group each supernode could take now.",
    ),
    PanelSpec(
        "Fragmentation",
        "timeseries",
        (("tidal_fragmentation_ratio", "cluster"),),
        unit="percentunit",
        description="1 - largest free slice / all free accelerators.",
    ),
    PanelSpec(
        "Stranded GPUs and defragmentation moves",
        "timeseries",
        (
            ("sum(tidal_stranded_gpus)", "stranded GPUs"),
            ("sum(increase(tidal_defrag_moves_total[15m]))", "moves per 15m"),
        ),
        description="Free accelerators no pending group size can use, and checkpoint-first moves that defragment.",
    ),
    PanelSpec(
        "Checkpoint-first evictions by outcome",
        "timeseries",
        (("sum by (outcome) (increase(tidal_evictions_total[15m]))", "{{outcome}}"),),
        description="Per 15m: evictions done whole or as shrinks, called off before any pod went, or taken over "
        "by another plan on the checkpoint request already sent.",
    ),
    PanelSpec("HBD violations (must be 0)", "stat", (("sum(tidal_hbd_violations_total)", "violations"),)),
    PanelSpec("Over-booked GPUs (must be 0)", "stat", (("sum(tidal_overbooked_gpus)", "over-booked"),)),
)


def build() -> dict:
    from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, timeseries
    from grafana_foundation_sdk.builders.common import StackingConfig as StackingConfigBuilder
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as common_models
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    board = (
        dashboard.Dashboard("tidal: GPU supernodes, gangs and the tide")
        .uid("tidal")
        .tags(["tidal", "gpu", "kubernetes"])
        .refresh("30s")
        .time("now-24h", "now")
        .timezone("browser")
    )
    builders = {"timeseries": timeseries.Panel, "heatmap": heatmap.Panel, "stat": stat.Panel}
    for spec in PANELS:
        panel = builders[spec.kind]().title(spec.title).description(spec.description).unit(spec.unit)
        panel = panel.datasource(DataSourceRef(type_val="prometheus", uid="${datasource}"))
        panel = panel.height(8).span(12 if spec.kind != "stat" else 6)
        if spec.stacked:
            panel = panel.stacking(StackingConfigBuilder().mode(common_models.StackingMode.NORMAL))
        for j, (expr, legend) in enumerate(spec.queries):
            panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + j)))
        board = board.with_panel(panel)
    built = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    built["templating"] = {
        "list": [
            {
                "name": "datasource",
                "type": "datasource",
                "query": "prometheus",
                "label": "Prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
            }
        ]
    }
    return built


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries() -> list[str]:
    return [expr for spec in PANELS for expr, _ in spec.queries]
