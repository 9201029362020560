"""Typed run configuration, built from an `ml_collections.ConfigDict` at the boundary.

Experiment files (`experiments/*.py`) return a `ConfigDict` so that command-line overrides work
(`--config.rl.group_size=8`); `from_config_dict` turns it into the frozen dataclasses below,
checking every field's type and range. Errors are `ValueError`s that name the field by its dotted
path, e.g. `config.rl.group_size must be >= 2, got 1`. Unknown fields are errors too (a typo must
not silently fall back to a default).

The library below this package only sees these dataclasses. Option vocabularies are defined once,
in the module that implements them (`core.advantages.TARGET_MODES`, `core.losses.AGGREGATIONS`,
...), and checked here against those tuples. The `workflow` section is the workflow's own config,
`agent.workflow_config.WorkflowConfig`.

* `train_config`: `TrainConfig` (every section, the checks between sections),
  `from_config_dict`, `to_dict`;
* `model_task`: `ModelSection`, `TaskSection` (what is trained on what);
* `algorithm`: `RLSection`;
* `optimization`: `WarmstartSection`;
* `runtime`: `EvalSection`, `CheckpointSection`, `LogSection`, `MeshSection`;
* `overrides`: `apply_overrides` (`SECTION.FIELD=VALUE` strings set in a `ConfigDict`, for
  drivers that build several configs in one process).

Sections kept by their owners, assembled here and re-exported: `LossSection` and
`OptimSection` (`learner/sections.py`), `CorrectionSection` and `ReplaySection`
(`replay/sections.py`), `SandboxSection` (`sandbox/sections.py`), `WorkflowConfig`
(`agent/workflow_config.py`). The field checks every section shares (`fail`, `check`, `choice`) are `agentic_grpo.field_checks`.
"""

from agentic_grpo.config.algorithm import RLSection
from agentic_grpo.config.model_task import ModelSection
from agentic_grpo.config.model_task import TaskSection
from agentic_grpo.config.optimization import WarmstartSection
from agentic_grpo.config.overrides import apply_overrides
from agentic_grpo.config.runtime import CheckpointSection
from agentic_grpo.config.runtime import EvalSection
from agentic_grpo.config.runtime import LogSection
from agentic_grpo.config.runtime import MeshSection
from agentic_grpo.config.train_config import from_config_dict
from agentic_grpo.config.train_config import SECTION_ORDER
from agentic_grpo.config.train_config import to_dict
from agentic_grpo.config.train_config import TrainConfig
from agentic_grpo.learner.sections import LossSection
from agentic_grpo.learner.sections import OptimSection
from agentic_grpo.replay.sections import CorrectionSection
from agentic_grpo.replay.sections import ReplaySection
from agentic_grpo.sandbox.sections import SandboxSection

__all__ = [
    "CheckpointSection", "CorrectionSection", "EvalSection", "LogSection", "LossSection",
    "MeshSection", "ModelSection", "OptimSection", "RLSection", "ReplaySection", "SECTION_ORDER",
    "SandboxSection", "TaskSection", "TrainConfig", "WarmstartSection", "apply_overrides",
    "from_config_dict", "to_dict",
]
