"""`tidal placement`: where every HBD group landed, one row per supernode."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kubernetes import client

from tidal import API_GROUP, API_VERSION
from tidal.k8s.compact import from_wire


def _list(custom: client.CustomObjectsApi, plural: str) -> list[dict[str, Any]]:
    return custom.list_cluster_custom_object(API_GROUP, API_VERSION, plural)["items"]


def placement_table(api_client: client.ApiClient) -> str:
    custom = client.CustomObjectsApi(api_client)
    supernodes = sorted(_list(custom, "supernodes"), key=lambda s: s["metadata"]["name"])
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    jobs = []
    for kind, plural in (("TrainingJob", "trainingjobs"), ("InferencePool", "inferencepools")):
        try:
            items = _list(custom, plural)
        except client.ApiException:
            continue
        for obj in items:
            st = obj.get("status") or {}
            name = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            jobs.append((kind, name, st.get("phase") or f"{st.get('placedReplicas', 0)} placed", st.get("reason", "")))
            if kind == "TrainingJob":
                st = from_wire(st)
            for g in st.get("placement") or []:
                groups[g["supernode"]][obj["metadata"]["name"]].append(g["group"])
    rows = [("SUPERNODE", "BLOCK", "GPUS", "FREE", "FAILED", "HBD GROUPS: workload[group indices]")]
    for sn in supernodes:
        st = sn.get("status") or {}
        gpus = st.get("gpus") or {}
        rows.append(
            (
                sn["metadata"]["name"],
                (sn["spec"].get("topology") or {}).get("block") or "-",
                str(gpus.get("total", 0)),
                str(gpus.get("free", 0)),
                str(gpus.get("failed", 0)),
                ", ".join(f"{w}[{_ranges(ids)}]" for w, ids in sorted(groups[sn["metadata"]["name"]].items())) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows]
    lines.append("")
    lines.append("WORKLOADS")
    for kind, name, phase, reason in sorted(jobs):
        lines.append(f"  {kind:<13} {name:<32} {phase:<12} {reason}")
    return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ids = sorted(ids)
    out, start = [], ids[0]
    for prev, cur in zip(ids, [*ids[1:], None], strict=True):
        run_ends = cur is None or cur != prev + 1
        if run_ends:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)
