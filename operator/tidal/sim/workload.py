"""Workload for the simulator, from the public traces plus a documented job model.

- Inference: ServeGen language-model request rates per 10-minute window (three models). Each model
  is a pool whose replica has `tp` GPUs and serves `rps_per_replica`; rates are scaled by one
  factor so that the busiest 10-minute *mean* needs `inference_peak_share` of the cluster (single
  minutes ask for more: at 0.4 and 24,048 GPUs the busiest minute needs 58%). Demand is kept per
  minute (`MINUTE`): each pool's 10-minute mean times ten consecutive per-minute factors drawn for
  that window from one hour of the Azure LLM inference trace 2023 (requests per minute over their
  10-minute mean, both services together, every 10-minute span of the hour's 58 whole minutes:
  49 overlapping blocks, about 5 independent; coefficient of variation 0.30, bursts to 2.18x the
  span's mean, most of it from the `code` service). The draw is a block bootstrap, independent per
  pool and window (no continuity across windows, no correlation between pools), each window's
  mean kept exactly. One hour of one trace is thin evidence: a longer per-request trace would be
  better, and `bursts=False` gives the smoothed model to compare.
- Trace windows: `window_offset_days` starts the ServeGen days (7, repeated) and the Helios days
  (15, repeated) that many days later, so a run can be repeated on other weeks of both traces.
- Training: job arrivals follow the Helios (Earth) >=8-GPU demand (running + pending GPUs) per
  10-minute window, scaled so that the offered training load averages `training_load_share` of
  the cluster; sizes come from TRAINING_MIX (workload_mix.py), capped to the group size the
  domain type holds; durations are log-normal fitted to the AcmeTrace summary of the Helios
  cluster's GPU jobs (median 206 s, mean 6,652 s, so sigma = sqrt(2 ln(6652/206)) = 2.64, capped
  at Helios's longest run, 4.32 M s), times (GPUs / 8)^0.3 since bigger gangs run longer. Half of
  the jobs with dp >= 2 are elastic down to dp/2; 90% are preemptible; priorities 0..3.
- Mixed fleets: each domain type (nvl72, cm384, hgx8) gets its share of the inference demand and
  of the training load by its share of the GPUs, its own accelerator and group sizes that fit it.
- Failures: the Llama 3 rate, 419 unexpected interruptions per 54 days on 16,384 GPUs, by cause
  (Table 5); each takes one node down: hardware causes for 4 h, software/unknown ones for 30 min.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from statistics import NormalDist

from tidal.placement.workload_mix import TRAINING_MIX, JobShape, sample_shapes

WINDOW = 600  # seconds: the traces' resolution
MINUTE = 60  # seconds: the inference demand's resolution
WARM_DAYS = 51  # > HELIOS_MAX_RUN_S: every job that could still run at day 0
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
SOFTWARE_CATEGORIES = {"Dependency", "Unknown"}
# AcmeTrace cluster_summary.csv, Helios row: GPU jobs' median and mean run time, longest run.
HELIOS_MEDIAN_RUN_S, HELIOS_MEAN_RUN_S, HELIOS_MAX_RUN_S = 206.0, 6651.681, 4_320_009.0
DURATION_SIGMA = math.sqrt(2 * math.log(HELIOS_MEAN_RUN_S / HELIOS_MEDIAN_RUN_S))


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
    accelerator: str = "nvidia.com/gpu"
    model: str = ""  # the ServeGen model whose rates the pool serves (default: its name)

    @property
    def trace_model(self) -> str:
        return self.model or self.name


POOLS = (
    PoolModel("m-large", 8, 4, 2.0),
    PoolModel("m-mid", 4, 4, 8.0),
    PoolModel("m-small", 2, 2, 30.0),
)


@dataclass(frozen=True)
class Domain:
    """What runs on one kind of supernode: its accelerator and the largest HBD group it holds."""

    kind: str
    accelerator: str
    max_group_gpus: int


DOMAINS = {
    "nvl72": Domain("nvl72", "nvidia.com/gpu", 72),
    "cm384": Domain("cm384", "huawei.com/Ascend910", 384),
    "hgx8": Domain("hgx8", "nvidia.com/gpu", 8),
}


def fit_shape(shape: JobShape, domain: Domain) -> JobShape:
    """The same job (same GPUs, same DP) with its HBD group cut to fit the domain: tensor and
    expert parallelism beyond the domain become pipeline stages."""
    model = shape.tp * shape.ep
    if model <= domain.max_group_gpus:
        return shape
    tp = min(shape.tp, domain.max_group_gpus)
    ep = max(1, domain.max_group_gpus // tp)
    while model % (tp * ep):
        ep //= 2
    return replace(shape, tp=tp, ep=ep, pp=shape.pp * model // (tp * ep))


def pools_for(kinds: dict[str, int]) -> tuple[PoolModel, ...]:
    """One pool per ServeGen model and domain type (named after the model alone when one type)."""
    if len(kinds) == 1:
        domain = DOMAINS[next(iter(kinds))]
        return tuple(replace(p, accelerator=domain.accelerator) for p in POOLS)
    return tuple(
        replace(p, name=f"{p.name}@{kind}", accelerator=DOMAINS[kind].accelerator, model=p.name)
        for kind in kinds
        for p in POOLS
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
    accelerator: str = "nvidia.com/gpu"
    live_resize: bool = False
    """How it resizes (the TrainingJob's spec.elastic.resize): Live (True) or Restart."""


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
    inference_replicas: dict[str, list[int]]  # pool -> desired replicas per demand_step_s
    arrivals: list[TrainingArrival]
    failures: list[Failure]
    scale: dict[str, float] = field(default_factory=dict)
    pools: tuple[PoolModel, ...] = POOLS
    demand_step_s: int = WINDOW
    """Resolution of inference_replicas: MINUTE from build_workload, WINDOW in hand-built tests."""
    _window_means: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def desired_at(self, pool: str, t: float) -> int:
        series = self.inference_replicas[pool]
        return series[min(int(t // self.demand_step_s), len(series) - 1)]

    def window_mean(self, pool: str, t: float) -> float:
        """Mean desired replicas of the 10-minute window holding t (what a forecast learns from)."""
        means = self._window_means.get(pool)
        if means is None:
            series = self.inference_replicas[pool]
            per = max(WINDOW // self.demand_step_s, 1)
            means = [sum(series[i : i + per]) / len(series[i : i + per]) for i in range(0, len(series), per)]
            self._window_means[pool] = means
        return means[min(max(int(t // WINDOW), 0), len(means) - 1)]


def _cycle(series: list[float], start: int, count: int) -> list[float]:
    """`count` values from `start` on, the series repeated as often as needed."""
    return [series[(start + i) % len(series)] for i in range(count)]


def _servegen(days: int, traces_dir: Path | None, offset_days: int = 0) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {p.name: [] for p in POOLS}  # by ServeGen model
    with trace_path("llm_rate_servegen_language_10min_day0-6.csv", traces_dir).open() as f:
        for row in csv.DictReader(f):
            if row["model"] in rates:
                rates[row["model"]].append(float(row["mean_rps"]))
    # The traces span 7 days: repeated for longer runs, started `offset_days` in.
    return {name: _cycle(series, offset_days * 144, days * 144) for name, series in rates.items()}


def _helios(days: int, traces_dir: Path | None, offset_days: int = 0) -> list[float]:
    demand = []
    with trace_path("training_demand_helios_earth16vc_10min_2020-05-01_15.csv", traces_dir).open() as f:
        for row in csv.DictReader(f):
            demand.append(float(row["running_gpu_num_noless_8"]) + float(row["pending_gpu_num_noless_8"]))
    return _cycle(demand, offset_days * 144, days * 144)


def burst_blocks(traces_dir: Path | None = None) -> list[list[float]]:
    """Every span of ten whole minutes of the Azure 2023 trace (both services), as factors over
    the span's mean: the shapes a 10-minute window's demand takes minute by minute. The trace's
    first and last minutes are cut short by its hour's edges and left out."""
    name = "llm_requests_azure2023_per_minute.csv"
    path = traces_dir / name if traces_dir is not None and (traces_dir / name).exists() else trace_path(name)
    with path.open() as f:
        counts = [int(r["code"]) + int(r["conv"]) for r in csv.DictReader(f)][1:-1]
    per = WINDOW // MINUTE
    blocks = []
    for start in range(len(counts) - per + 1):
        span = counts[start : start + per]
        mean = sum(span) / per
        blocks.append([c / mean for c in span])
    return blocks


def per_minute(window_rates: list[float], blocks: list[list[float]], rng: random.Random) -> list[float]:
    """Each window's rate spread over its minutes by one randomly drawn block (mean kept)."""
    out: list[float] = []
    for rate in window_rates:
        out.extend(rate * f for f in rng.choice(blocks))
    return out


def _failure_causes(traces_dir: Path | None) -> list[tuple[str, str, int]]:
    with trace_path("failures_llama3_405b_54day.csv", traces_dir).open() as f:
        return [(r["component"], r["category"], int(r["interruptions"])) for r in csv.DictReader(f)]


def median_duration_s(shape: JobShape) -> float:
    return HELIOS_MEDIAN_RUN_S * (shape.gpus / 8) ** 0.3


def mean_duration_s(shape: JobShape) -> float:
    """Mean of the capped log-normal: E[min(X, cap)]."""
    m, s, c = median_duration_s(shape), DURATION_SIGMA, HELIOS_MAX_RUN_S
    normal = NormalDist()
    return m * math.exp(s * s / 2) * normal.cdf((math.log(c / m) - s * s) / s) + c * (
        1 - normal.cdf(math.log(c / m) / s)
    )


def mix_gpu_time_shares(mix: tuple[JobShape, ...] = TRAINING_MIX) -> list[tuple[JobShape, float, float]]:
    """(shape, share of jobs, share of offered GPU-time) for each shape of the mix."""
    weights = sum(s.weight for s in mix)
    gpu_time = {s: s.weight / weights * s.gpus * mean_duration_s(s) for s in mix}
    total = sum(gpu_time.values())
    return [(s, s.weight / weights, gpu_time[s] / total) for s in mix]


def build_workload(
    *,
    cluster_gpus: int,
    nodes: int,
    days: int,
    seed: int,
    inference_peak_share: float = 0.4,
    training_load_share: float = 1.0,
    traces_dir: Path | None = None,
    kinds: dict[str, int] | None = None,
    live_share: float = 0.0,
    window_offset_days: int = 0,
    bursts: bool = True,
) -> Workload:
    """`kinds`: GPUs per domain type (default: all NVL72). `live_share`: the share of elastic
    jobs that resize Live (drawn from a stream of its own, so the arrivals do not depend on it).
    `bursts` False keeps each window's mean for its ten minutes (the old, smoothed demand)."""
    rng = random.Random(seed)
    kinds = kinds or {"nvl72": cluster_gpus}
    pools = pools_for(kinds)
    rates = _servegen(days, traces_dir, window_offset_days)
    blocks = burst_blocks(traces_dir) if bursts else [[1.0] * (WINDOW // MINUTE)]
    burst_rng = random.Random(seed * 104_729 + 17)
    # One scale factor for all models keeps their mix; the busiest window needs the peak share
    # of each domain type's GPUs.
    replicas: dict[str, list[int]] = {}
    scale: dict[str, float] = {}
    for kind, gpus in kinds.items():
        mine = [p for p in pools if p.accelerator == DOMAINS[kind].accelerator and (len(kinds) == 1 or kind in p.name)]
        peak = max(sum(rates[p.trace_model][w] / p.rps_per_replica * p.tp for p in mine) for w in range(days * 144))
        k = inference_peak_share * gpus / peak
        scale[f"inference_rate_scale_{kind}"] = k
        for p in mine:
            minutes = per_minute(rates[p.trace_model], blocks, burst_rng)
            replicas[p.name] = [math.ceil(r * k / p.rps_per_replica - 1e-9) for r in minutes]

    demand = _helios(days, traces_dir, window_offset_days)
    mean_demand = sum(demand) / len(demand)
    arrivals: list[TrainingArrival] = []
    for kind, gpus in kinds.items():
        domain = DOMAINS[kind]
        # Nobody submits a gang bigger than a quarter of the GPUs of its kind.
        mix = tuple(fit_shape(s, domain) for s in TRAINING_MIX if s.gpus <= max(gpus // 4, 8))
        weights = sum(s.weight for s in mix)
        mean_gpu_seconds = sum(s.weight / weights * s.gpus * mean_duration_s(s) for s in mix)
        base_rate = training_load_share * gpus / mean_gpu_seconds  # arrivals per second
        scale[f"training_arrivals_per_hour_{kind}"] = base_rate * 3600
        # The cluster starts in steady state: jobs that arrived in the WARM_DAYS before day 0
        # and would still run arrive at 0 with the rest of their work (a separate random
        # stream, so the week's own arrivals do not depend on it).
        warm = random.Random(seed * 7919 + len(arrivals))
        for w in range(-WARM_DAYS * 144, len(demand)):
            r = warm if w < 0 else rng
            d = mean_demand if w < 0 else demand[w]
            count = _poisson(r, base_rate * WINDOW * d / mean_demand)
            for _ in range(count):
                shape = sample_shapes(r, 1, mix)[0]
                duration = min(median_duration_s(shape) * math.exp(r.gauss(0, DURATION_SIGMA)), HELIOS_MAX_RUN_S)
                elastic = shape.dp >= 2 and r.random() < 0.5
                at = w * WINDOW + r.random() * WINDOW
                arrival = TrainingArrival(
                    job_id=0,
                    at=max(at, 0.0),
                    shape=shape,
                    duration_s=max(duration + min(at, 0.0), 1.0),
                    priority=r.randint(0, 3),
                    preemptible=r.random() < 0.9,
                    min_dp=max(1, shape.dp // 2) if elastic else None,
                    accelerator=domain.accelerator,
                )
                if at + duration > 0:
                    arrivals.append(arrival)
    arrivals.sort(key=lambda a: (a.at, a.shape.gpus))
    live_rng = random.Random(seed * 15_485_863 + 3)
    arrivals = [
        replace(a, job_id=i, live_resize=a.min_dp is not None and live_rng.random() < live_share)
        for i, a in enumerate(arrivals)
    ]

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
    return Workload(days, replicas, arrivals, failures, scale, pools, demand_step_s=MINUTE)


def _poisson(rng: random.Random, mean: float) -> int:
    if mean > 30:  # normal approximation, still deterministic for the seed
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
