"""Shared pieces of the three resource models: camelCase wire names, conditions, errors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base for every spec/status object: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type, e.g. Admitted, Placed, Preempted.")
    status: str = Field(description="True, False or Unknown.", pattern="^(True|False|Unknown)$")
    reason: str = Field(default="", description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable explanation with the numbers behind it.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")


class InvalidSpec(ValueError):
    """A resource spec that fails validation; each message names the offending field."""

    def __init__(self, messages: list[str]):
        super().__init__("; ".join(messages))
        self.messages = messages


_CONSTRAINT_TEMPLATES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "string_pattern_mismatch": "must match {pattern}",
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "literal_error": "must be one of {expected}",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "bool_type": "must be a boolean",
    "bool_parsing": "must be a boolean",
    "string_type": "must be a string",
}


def field_path(loc: tuple[int | str, ...], root: str) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def describe_errors(err: ValidationError, root: str = "spec") -> list[str]:
    """Turn pydantic errors into `spec.field: message` lines a user can act on."""
    messages = []
    for e in err.errors():
        if e["type"] == "value_error":
            text = str(e["ctx"]["error"]) if "ctx" in e else e["msg"]
            # Model validators name their own field ("spec.x: ..."); field validators do not.
            messages.append(text if text.startswith(root + ".") else f"{field_path(e['loc'], root)}: {text}")
            continue
        template = _CONSTRAINT_TEMPLATES.get(e["type"])
        text = template.format(**e.get("ctx", {})) if template else e["msg"]
        messages.append(f"{field_path(e['loc'], root)}: {text}")
    return messages


def priority_class_name_field() -> Any:
    """`spec.priorityClassName` of TrainingJob and InferencePool: priorities as pods have them."""
    return Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="PriorityClass whose value orders and may preempt (as for pods; tidal's pods get it too). "
        "None: the globalDefault PriorityClass's value, or 0. A class that does not exist keeps it Pending.",
    )


def deprecated_priority_field(default: int) -> Any:
    """The integer `spec.priority` that any tenant could set: kept readable, ignored by default."""
    return Field(
        default=default,
        ge=-1_000_000,
        le=1_000_000,
        description="Deprecated, ignored: any tenant could outrank any other. Use priorityClassName. Honoured "
        "only when the operator runs with --spec-priority (all tenants trusted).",
    )
