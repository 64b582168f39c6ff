"""Pydantic models of the tidal.dev resources; the CRD schemas are generated from them."""

from tidal.model.common import ApiModel, Condition, InvalidSpec, describe_errors
from tidal.model.inference_pool import InferencePoolSpec, InferencePoolStatus
from tidal.model.supernode import SupernodeSpec, SupernodeStatus
from tidal.model.training_job import JobPhase, TrainingJobSpec, TrainingJobStatus

__all__ = [
    "ApiModel",
    "Condition",
    "InferencePoolSpec",
    "InferencePoolStatus",
    "InvalidSpec",
    "JobPhase",
    "SupernodeSpec",
    "SupernodeStatus",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "describe_errors",
]
