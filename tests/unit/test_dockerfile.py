"""No Docker engine here: the Dockerfile is parsed and held to the rules it promises."""

from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]


def instructions() -> list[dict]:
    parser = DockerfileParser(path=str(REPO / "Dockerfile"))
    return parser.structure


def test_multi_stage_slim_non_root_with_tidal_entrypoint():
    ins = instructions()
    froms = [i["value"] for i in ins if i["instruction"] == "FROM"]
    assert len(froms) == 2 and all(f.startswith("python:3.11-slim") for f in froms)
    final = ins[max(i for i, x in enumerate(ins) if x["instruction"] == "FROM") :]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users and not users[-1].startswith(("0", "root")), "runs as a non-root user"
    entry = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert entry == ['["tidal"]'] and [i["value"] for i in final if i["instruction"] == "CMD"] == ['["run"]']
    copies = [i["value"] for i in final if i["instruction"] == "COPY"]
    assert copies == ["--from=build /dist/*.whl /tmp/"], "only the wheel reaches the runtime stage"


def test_pinned_tools_and_no_cache():
    for i in instructions():
        if i["instruction"] == "RUN" and "pip install" in i["value"]:
            assert "--no-cache-dir" in i["value"]
        if i["instruction"] == "FROM":
            assert ":latest" not in i["value"] and ":" in i["value"]
    assert "tests" in (REPO / ".dockerignore").read_text().split()
