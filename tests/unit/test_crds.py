from pathlib import Path

import yaml

from tidal.cli import main
from tidal.model.crd import RESOURCE_KINDS, render_crds

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def test_crds_directory_matches_the_models_byte_for_byte():
    rendered = render_crds()
    on_disk = {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    assert sorted(on_disk) == sorted(rendered), "run `tidal crds` to regenerate crds/"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"crds/{name} drifted from the models; run `tidal crds`"


def test_chart_crds_match_the_models_byte_for_byte():
    chart = {p.name: p.read_text() for p in (CRD_DIR.parent / "charts" / "tidal" / "crds").glob("*.yaml")}
    assert chart == render_crds(), "run `tidal crds` to regenerate charts/tidal/crds/"


def test_tidal_crds_check_detects_drift(tmp_path):
    args = ["--out", str(tmp_path / "a"), "--chart-crds", str(tmp_path / "b")]
    assert main(["crds", *args]) == 0
    assert main(["crds", "--check", *args]) == 0
    victim = next((tmp_path / "b").glob("*trainingjobs.yaml"))
    victim.write_text(victim.read_text().replace("Tensor-parallel", "Tensor parallel"))
    assert main(["crds", "--check", *args]) == 1


def _walk(node, path=""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schemas_are_structural_and_described():
    for k in RESOURCE_KINDS:
        crd = yaml.safe_load(render_crds()[f"tidal.dev_{k.plural}.yaml"])
        version = crd["spec"]["versions"][0]
        # Status on every kind; scale (for HPA/KEDA) only on InferencePool, whose paths must exist.
        scale = {"scale": k.scale} if k.kind == "InferencePool" else {}
        assert version["subresources"] == {"status": {}, **scale}
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            assert node.get("additionalProperties") is not False, path
            if "properties" in node and path.count(".properties.") >= 1:
                for name, sub in node["properties"].items():
                    assert sub.get("description"), f"{path}.{name} has no description for kubectl explain"
        for path in (k.scale or {}).values():  # ".spec.replicas" -> spec, replicas in the schema
            node = schema
            for part in path.lstrip(".").split("."):
                node = node["properties"][part]
            assert node["type"] in ("integer", "string"), path


def test_cross_field_rules_are_cel_validations():
    by_kind = {k.kind: yaml.safe_load(render_crds()[f"tidal.dev_{k.plural}.yaml"]) for k in RESOURCE_KINDS}
    tj_spec = by_kind["TrainingJob"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [v["rule"] for v in tj_spec["x-kubernetes-validations"]]
    assert any("gpusPerPod % (self.tp * self.ep)" in r for r in rules)
    assert any("minDP" in r for r in rules)
    assert tj_spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True
    names = by_kind["InferencePool"]["spec"]["names"]
    assert names["shortNames"] == ["tpool", "tidalpool"], "no generic short name that clashes with Gateway API"
    assert by_kind["Supernode"]["spec"]["scope"] == "Cluster"
