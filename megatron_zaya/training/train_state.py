"""What a run has done so far, saved in every checkpoint (checkpoint/training.py) and restored on a resume:
counters, the schedules' position, and where the training data stands (training/data_phase.py)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainState:
    iteration: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0        # summed per step: stays right when --seq-length changes on a resume
    consumed_valid_samples: int = 0
    skipped_iterations: int = 0
    skipped_train_samples: int = 0  # samples of the iterations --iterations-to-skip passed over
    floating_point_operations: float = 0.0   # model FLOPs of every step so far, all ranks (--log-progress)
    train_seconds: float = 0.0               # wall time of the steps so far, across jobs
    # The schedules' position: what the successful steps consumed, in samples (--train-samples runs)
    # and in global batches, each step counting its batch over the --global-batch-size of its time (so
    # a later phase with another batch size continues the schedule where the run is).
    scheduled_samples: int = 0
    scheduled_iterations: float = 0.0
    data_signature: str = ""        # the current data phase (megatron_zaya/training/data_phase.py)
    data_start_iteration: int = 0
    data_start_samples: int = 0
    data_blocks: list = field(default_factory=list)   # its train dataset's sizes across jobs (data/train_blocks.py)
    data_offsets: dict = field(default_factory=dict)  # per dataset and block, the samples earlier phases read,
    data_index_sizes: dict = field(default_factory=dict)  # and the samples its index was built for (data_phase.py)
    # non-finite steps in a row so far (--max-consecutive-nonfinite): a run resumed in a streak stops where the
    # uninterrupted run would
    consecutive_nonfinite: int = 0
