"""Label, annotation and finalizer names tidal reads and writes."""

SUPERNODE = "tidal.dev/supernode"
BLOCK = "tidal.dev/block"
SPINE = "tidal.dev/spine"
ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_CLIQUE = "nvidia.com/gpu.clique"
SPARE = "tidal.dev/spare"

JOB = "tidal.dev/job"
POOL = "tidal.dev/pool"
HBD_GROUP = "tidal.dev/hbd-group"
RANK = "tidal.dev/rank"
REPLICA = "tidal.dev/replica"
MANAGED_BY = "app.kubernetes.io/managed-by"

GANG_GATE = "tidal.dev/gang"
CHECKPOINT_REQUESTED = "tidal.dev/checkpoint-requested"
CHECKPOINT_DONE = "tidal.dev/checkpoint-done"
