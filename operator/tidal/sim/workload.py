"""Workload for the simulator, from the public traces plus a documented job model.

- Inference: ServeGen language-model request rates per 10-minute window (three models). Each model
  is a pool whose replica has `tp` GPUs and serves `rps_per_replica`; rates are scaled by one
  factor so that the busiest window needs `inference_peak_share` of the cluster.
- Training: job arrivals follow the Helios (Earth) >=8-GPU demand (running + pending GPUs) per
  10-minute window, scaled so that the offered training load averages `training_load_share` of
  the cluster; sizes come from TRAINING_MIX (calibrated on AcmeTrace/Helios, see workload_mix.py);
  durations are log-normal with a median of 1 h x (GPUs / 8)^0.3 and sigma 1.0, capped at 48 h
  (long LLM gangs run longer; AcmeTrace reports heavy-tailed run times). Half of the jobs with
  dp >= 2 are elastic down to dp/2; 90% are preemptible; priorities 0..3.
- Failures: the Llama 3 rate, 419 unexpected interruptions per 54 days on 16,384 GPUs, by cause
  (Table 5); each takes one node down: hardware causes for 4 h, software/unknown ones for 30 min.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from tidal.placement.workload_mix import TRAINING_MIX, JobShape, sample_shapes

WINDOW = 600  # seconds: the traces' resolution
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
SOFTWARE_CATEGORIES = {"Dependency", "Unknown"}


def trace_path(name: str, traces_dir: Path | None = None) -> Path:
    if traces_dir is not None:
        return traces_dir / name
    return Path(str(resources.files("tidal.sim") / "data" / name))


@dataclass(frozen=True)
class PoolModel:
    name: str
    tp: int
    gpus_per_pod: int
    rps_per_replica: float


POOLS = (
    PoolModel("m-large", 8, 4, 2.0),
    PoolModel("m-mid", 4, 4, 8.0),
    PoolModel("m-small", 2, 2, 30.0),
)


@dataclass(frozen=True)
class TrainingArrival:
    job_id: int
    at: float
    shape: JobShape
    duration_s: float
    priority: int
    preemptible: bool
    min_dp: int | None


@dataclass(frozen=True)
class Failure:
    at: float
    node_index: int
    cause: str
    category: str
    down_s: float


@dataclass
class Workload:
    days: int
    inference_replicas: dict[str, list[int]]  # pool -> desired replicas per window
    arrivals: list[TrainingArrival]
    failures: list[Failure]
    scale: dict[str, float] = field(default_factory=dict)

    def desired_at(self, pool: str, t: float) -> int:
        series = self.inference_replicas[pool]
        return series[min(int(t // WINDOW), len(series) - 1)]


def _servegen(days: int, traces_dir: Path | None) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {p.name: [] for p in POOLS}
    with trace_path("llm_rate_servegen_language_10min_day0-6.csv", traces_dir).open() as f:
        for row in csv.DictReader(f):
            if row["model"] in rates and int(row["day"]) < days:
                rates[row["model"]].append(float(row["mean_rps"]))
    for name, series in rates.items():  # traces span 7 days: repeat for longer runs
        base = list(series)
        while len(series) < days * 144:
            series.extend(base[: days * 144 - len(series)])
        rates[name] = series[: days * 144]
    return rates


def _helios(days: int, traces_dir: Path | None) -> list[float]:
    demand = []
    with trace_path("training_demand_helios_earth16vc_10min_2020-05-01_15.csv", traces_dir).open() as f:
        for row in csv.DictReader(f):
            demand.append(float(row["running_gpu_num_noless_8"]) + float(row["pending_gpu_num_noless_8"]))
    while len(demand) < days * 144:
        demand.extend(demand[: days * 144 - len(demand)])
    return demand[: days * 144]


def _failure_causes(traces_dir: Path | None) -> list[tuple[str, str, int]]:
    with trace_path("failures_llama3_405b_54day.csv", traces_dir).open() as f:
        return [(r["component"], r["category"], int(r["interruptions"])) for r in csv.DictReader(f)]


def median_duration_s(shape: JobShape) -> float:
    return 3600.0 * (shape.gpus / 8) ** 0.3


def build_workload(
    *,
    cluster_gpus: int,
    nodes: int,
    days: int,
    seed: int,
    inference_peak_share: float = 0.4,
    training_load_share: float = 1.0,
    traces_dir: Path | None = None,
) -> Workload:
    rng = random.Random(seed)
    rates = _servegen(days, traces_dir)
    # One scale factor for all models keeps their mix; the busiest window needs the peak share.
    peak_gpus = max(sum(rates[p.name][w] / p.rps_per_replica * p.tp for p in POOLS) for w in range(days * 144))
    k = inference_peak_share * cluster_gpus / peak_gpus
    replicas = {p.name: [math.ceil(r * k / p.rps_per_replica) for r in rates[p.name]] for p in POOLS}

    demand = _helios(days, traces_dir)
    mean_demand = sum(demand) / len(demand)
    mix = TRAINING_MIX
    weights = sum(s.weight for s in mix)
    mean_gpu_seconds = sum(s.weight / weights * s.gpus * median_duration_s(s) * math.exp(0.5) for s in mix)
    base_rate = training_load_share * cluster_gpus / mean_gpu_seconds  # arrivals per second
    arrivals = []
    for w, d in enumerate(demand):
        expected = base_rate * WINDOW * d / mean_demand
        count = _poisson(rng, expected)
        for _ in range(count):
            shape = sample_shapes(rng, 1, mix)[0]
            duration = min(median_duration_s(shape) * math.exp(rng.gauss(0, 1.0)), 48 * 3600)
            elastic = shape.dp >= 2 and rng.random() < 0.5
            arrivals.append(
                TrainingArrival(
                    job_id=len(arrivals),
                    at=w * WINDOW + rng.random() * WINDOW,
                    shape=shape,
                    duration_s=duration,
                    priority=rng.randint(0, 3),
                    preemptible=rng.random() < 0.9,
                    min_dp=max(1, shape.dp // 2) if elastic else None,
                )
            )
    arrivals.sort(key=lambda a: (a.at, a.job_id))

    causes = _failure_causes(traces_dir)
    per_gpu_second = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 86400 * LLAMA3_GPUS)
    rate = per_gpu_second * cluster_gpus
    failures, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= days * 86400:
            break
        component, category, _ = rng.choices(causes, weights=[n for _, _, n in causes])[0]
        down = 1800.0 if category in SOFTWARE_CATEGORIES else 4 * 3600.0
        failures.append(Failure(t, rng.randrange(nodes), component, category, down))
    return Workload(
        days, replicas, arrivals, failures, {"inference_rate_scale": k, "training_arrivals_per_hour": base_rate * 3600}
    )


def _poisson(rng: random.Random, mean: float) -> int:
    if mean > 30:  # normal approximation, still deterministic for the seed
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
