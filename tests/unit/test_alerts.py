"""Alert rules checked and unit-tested by the real promtool (Debian's prometheus package)."""

import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "tidal" / "files" / "tidal-alerts.yaml"
PROMTOOL = shutil.which("promtool")
MISSING = "promtool not found: e2e/setup.sh installs it (Debian package prometheus)"


def test_rules_pass_promtool_check():
    assert PROMTOOL, MISSING
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_rules_unit_tests():
    assert PROMTOOL, MISSING
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yaml"], cwd=REPO / "tests" / "promtool", capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_unit_test():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {
        t["alertname"]
        for case in yaml.safe_load((REPO / "tests/promtool/alerts_test.yaml").read_text())["tests"]
        for t in case["alert_rule_test"]
        if t.get("exp_alerts")
    }
    assert alerts == tested
