"""The pure core imports nothing from Kubernetes, kopf or the k8s layer (docs/design.md, Layers)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "tidal"
PURE = ("model", "topology", "placement", "rebalance", "sim")
FORBIDDEN = ("kubernetes", "kopf", "tidal.k8s")


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", PURE)
def test_pure_core_imports_no_kubernetes(package):
    files = sorted((PACKAGE / package).rglob("*.py"))
    assert files, f"no modules under {package}/"
    bad = {
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in files
        for module in imported_modules(path)
        if any(module == f or module.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, f"the pure core imports the Kubernetes side: {sorted(bad)}"


def test_the_check_sees_a_forbidden_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from tidal.k8s.manifests import GangShape\nimport kopf\n")
    assert {"tidal.k8s.manifests", "kopf"} <= imported_modules(sample)
