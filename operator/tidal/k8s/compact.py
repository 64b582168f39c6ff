"""The compact wire form of a TrainingJob's placement (`status.assignment`).

Inside the operator a placement is a list of {group, supernode, nodes} (one node per pod, in rank
order). Written out that way it costs 160 KiB for a 16,384-GPU job at 4 GPUs per pod and 604 KiB at
1 GPU per pod; the largest jobs would pass etcd's 1.5 MiB object limit. On the wire it is two
strings, in the spirit of Kueue's TopologyAssignment (each node once, referenced by index):

    nodes:  "nvl72-0000-n[00-17],nvl72-0001-n[00-03,05-17]"
            every node the job uses, once, in order of first use, as Slurm-style hostlists
    groups: "0-3@nvl72-0000=0-15*4;4-7@nvl72-0001=16-31*4"
            runs of consecutive groups on one supernode: first-last@supernode=pods, where pods
            are the node-table indices of the run's pods in rank order ("a-b" each once,
            "a-b*k" each k times in a row); the run's pods split evenly among its groups

Both strings have a maxLength in the CRD schema (`ASSIGNMENT_*_MAX`), so the schema itself bounds
a TrainingJob's status well under etcd's limit; a plan whose encoding would not fit is refused
at admission (`fits`). `from_wire` also reads the old form (`status.placement` as a list).
"""

from __future__ import annotations

import re
from typing import Any

from tidal.model.training_job import ASSIGNMENT_GROUPS_MAX, ASSIGNMENT_NODES_MAX

_TAIL = re.compile(r"^(.*?)(\d+)$")


# -- hostlists ------------------------------------------------------------------------------
def hostlist(names: list[str]) -> str:
    """["n00", "n01", "n02", "n05", "x"] -> "n[00-02,05],x" (order kept: it expands back the same)."""
    tokens: list[str] = []
    prefix: str | None = None
    width = 0
    ranges: list[list[int]] = []

    def flush() -> None:
        if prefix is None:
            return
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            tokens.append(f"{prefix}{ranges[0][0]:0{width}d}")
            return
        parts = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in ranges]
        tokens.append(f"{prefix}[{','.join(parts)}]")

    for name in names:
        m = _TAIL.match(name)
        if m is None:
            flush()
            prefix, ranges = None, []
            tokens.append(name)
            continue
        p, digits = m.group(1), m.group(2)
        n = int(digits)
        if p == prefix and len(digits) == width:
            if n == ranges[-1][1] + 1:
                ranges[-1][1] = n
            else:
                ranges.append([n, n])
            continue
        flush()
        prefix, width, ranges = p, len(digits), [[n, n]]
    flush()
    return ",".join(tokens)


def expand_hostlist(text: str) -> list[str]:
    names: list[str] = []
    for token in _split_top(text, ","):
        if "[" not in token:
            names.append(token)
            continue
        prefix, rest = token.split("[", 1)
        body, suffix = rest.split("]", 1)
        for part in body.split(","):
            a, _, b = part.partition("-")
            width = len(a)
            for n in range(int(a), int(b or a) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return names


def _split_top(text: str, sep: str) -> list[str]:
    if not text:
        return []
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


# -- index runs -----------------------------------------------------------------------------
def _indices(seq: list[int]) -> str:
    pairs: list[list[int]] = []  # [index, repeat]
    for i in seq:
        if pairs and pairs[-1][0] == i:
            pairs[-1][1] += 1
        else:
            pairs.append([i, 1])
    tokens: list[str] = []
    a = b = k = None
    for i, rep in pairs:
        if a is not None and i == b + 1 and rep == k:
            b = i
            continue
        if a is not None:
            tokens.append(_token(a, b, k))
        a, b, k = i, i, rep
    if a is not None:
        tokens.append(_token(a, b, k))
    return ",".join(tokens)


def _token(a: int, b: int, k: int) -> str:
    span = str(a) if a == b else f"{a}-{b}"
    return span if k == 1 else f"{span}*{k}"


def _expand_indices(text: str) -> list[int]:
    out: list[int] = []
    for token in text.split(",") if text else []:
        span, _, rep = token.partition("*")
        a, _, b = span.partition("-")
        k = int(rep or 1)
        for i in range(int(a), int(b or a) + 1):
            out.extend([i] * k)
    return out


# -- placement <-> assignment ---------------------------------------------------------------
def encode(placement: list[dict[str, Any]]) -> dict[str, str]:
    groups = sorted(placement, key=lambda g: g["group"])
    table: dict[str, int] = {}
    for g in groups:
        for node in g["nodes"]:
            table.setdefault(node, len(table))
    runs: list[str] = []
    i = 0
    while i < len(groups):
        j = i
        while (
            j + 1 < len(groups)
            and groups[j + 1]["group"] == groups[j]["group"] + 1
            and groups[j + 1]["supernode"] == groups[i]["supernode"]
            and len(groups[j + 1]["nodes"]) == len(groups[i]["nodes"])
        ):
            j += 1
        first, last = groups[i]["group"], groups[j]["group"]
        ids = str(first) if first == last else f"{first}-{last}"
        pods = _indices([table[n] for g in groups[i : j + 1] for n in g["nodes"]])
        runs.append(f"{ids}@{groups[i]['supernode']}={pods}")
        i = j + 1
    return {"nodes": hostlist(list(table)), "groups": ";".join(runs)}


def decode(assignment: dict[str, str]) -> list[dict[str, Any]]:
    table = expand_hostlist(assignment.get("nodes", ""))
    placement: list[dict[str, Any]] = []
    for run in assignment.get("groups", "").split(";") if assignment.get("groups") else []:
        ids, rest = run.split("@", 1)
        supernode, pods = rest.split("=", 1)
        first, _, last = ids.partition("-")
        group_ids = range(int(first), int(last or first) + 1)
        nodes = [table[i] for i in _expand_indices(pods)]
        per = len(nodes) // len(group_ids)
        for k, g in enumerate(group_ids):
            placement.append({"group": g, "supernode": supernode, "nodes": nodes[k * per : (k + 1) * per]})
    return placement


def fits(assignment: dict[str, str]) -> bool:
    return len(assignment["nodes"]) <= ASSIGNMENT_NODES_MAX and len(assignment["groups"]) <= ASSIGNMENT_GROUPS_MAX


def to_wire(status: dict[str, Any]) -> dict[str, Any]:
    """A TrainingJob status as the operator holds it -> as it is written (placement compacted)."""
    if "placement" not in status:
        return status
    out = {k: v for k, v in status.items() if k != "placement"}
    if status["placement"]:
        out["assignment"] = encode(status["placement"])
    return out


def from_wire(status: dict[str, Any]) -> dict[str, Any]:
    """A TrainingJob status as read -> as the operator holds it. Old objects carry
    `placement` as a list (the form before `assignment`); it is read as it is."""
    if "assignment" not in status:
        return status
    out = {k: v for k, v in status.items() if k != "assignment"}
    out["placement"] = decode(status["assignment"] or {})
    return out
