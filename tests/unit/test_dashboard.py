import json
from pathlib import Path

from tidal.cli import main
from tidal.dashboard import PANELS, queries, render

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "charts" / "tidal" / "files" / "tidal-dashboard.json"


def test_dashboard_json_is_generated_from_code():
    assert CHECKED_IN.read_text() == render(), "run `tidal dashboard` to regenerate it"


def test_dashboard_check_detects_drift(tmp_path):
    out = tmp_path / "d.json"
    assert main(["dashboard", "--out", str(out)]) == 0
    assert main(["dashboard", "--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("the tide", "the tidy"))
    assert main(["dashboard", "--check", "--out", str(out)]) == 1


def test_panels_cover_what_operators_watch():
    board = json.loads(render())
    titles = [p["title"] for p in board["panels"]]
    assert titles == [p.title for p in PANELS]
    kinds = {p["title"]: p["type"] for p in board["panels"]}
    assert kinds["Free GPUs per supernode"] == "heatmap"
    exprs = " ".join(queries())
    for metric in (
        "tidal_supernode_gpus",
        "tidal_gpus",
        "tidal_pending_jobs",
        "tidal_placement_duration_seconds",
        "tidal_rebalance_moves_total",
        "tidal_preemptions_total",
        "tidal_restarts_total",
    ):
        assert metric in exprs, metric
    assert all(t["datasource"]["uid"] == "${datasource}" for t in board["panels"])


def test_readme_lists_every_panel():
    readme = (REPO / "README.md").read_text()
    for spec in PANELS:
        assert f"| {spec.title} |" in readme, spec.title
