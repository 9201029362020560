"""Config drift on resume: which fields a resumed run may change, and the check.

A workdir's `config.json` is the config its checkpoints were written under. A resume with a
config that changes what the saved state means (the model, the group size, the stages, the
task stream, the objective, ...) would load without error and then train a different
experiment, or fail far from the cause. `check` compares the saved config with the new one:
every changed field of `FIXED` is refused, all of them in one `ConfigDriftError`; changed
fields of `MAY_CHANGE` (cadences, logging, resources, the run's length) are returned for the log.

Every field of every `config` section is in exactly one of the two sets (`tests/
config_drift_test.py` checks it), so a new field forces a decision. A field missing from an
older saved config counts as its dataclass default.
"""

import dataclasses
import json
import typing
from typing import Any, Mapping

from agentic_grpo import config as config_lib
from agentic_grpo import exit_codes

# Fields that change the meaning of the saved state (learner state, replay, in-flight episodes,
# data position, step layout) or the experiment itself.
FIXED = frozenset({
    "seed",
    "model.source", "model.path", "model.param_dtype", "model.preset", "model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads",
    "model.head_dim", "model.mlp_dim", "model.max_seq_len",
    "task.source", "task.seed", "task.depths", "task.string_prob", "task.ambiguity_target",
    "task.num_public", "task.num_hidden", "task.split_by", "task.train_size", "task.eval_split",
    "task.path", "task.heldout_fraction", "task.split_seed", "task.stdio_layout",
    "task.check_references", "task.float_tolerance", "task.tfds_name",
    "workflow.stages", "workflow.prompt_format", "workflow.max_debug_rounds", "workflow.reference_debug",
    "workflow.reward_mode", "workflow.reference_fix_fraction",
    "workflow.reference_error_rate", "workflow.num_agent_tests",
    "workflow.num_pieces",
    "workflow.stage_rewards", "workflow.max_new_tokens", "workflow.max_obs_chars",
    "workflow.max_value_chars", "workflow.min_test_input_len",
    "rl.tasks_per_batch", "rl.group_size", "rl.batches_in_flight", "rl.rows_per_update",
    "rl.temperature", "rl.top_k", "rl.top_p", "rl.buckets",
    "rl.dynamic_sampling", "rl.dynamic_sampling_max_batches", "rl.pass_rate_filter",
    "rl.final_reward_lag", "rl.ppo_epochs",
    # 'always' samples from contexts partly computed by older policies: other behaviour
    # log-probs ('same_version' only float rounding, but one field has one set).
    "rl.reuse_prefix",
    "loss.eps_low", "loss.eps_high", "loss.ratio_level", "loss.aggregation", "loss.max_tokens",
    "loss.kl_beta", "loss.kl_estimator", "loss.entropy_coef", "loss.dual_clip",
    "correction.enabled", "correction.target", "correction.gamma", "correction.beta",
    "correction.scale", "correction.baseline", "correction.negative_weight",
    "correction.max_staleness",
    "correction.staleness_mode", "correction.stage_credit", "correction.supersede_queued",
    "replay.capacity", "replay.when_full", "replay.skip_zero_advantage",
    "replay.pack_corrections",
    "optim.learning_rate", "optim.warmup_steps", "optim.schedule", "optim.final_lr_fraction",
    "optim.weight_decay", "optim.b1", "optim.b2", "optim.eps", "optim.grad_clip",
    "warmstart.steps", "warmstart.batch_size", "warmstart.learning_rate",
    "warmstart.warmup_steps", "warmstart.final_lr_fraction", "warmstart.seq_len",
    "mesh.data", "mesh.fsdp", "mesh.tensor",
})

# Fields a resumed run may change: how long it runs, how often it evaluates, checkpoints and
# logs, resources, guards, and the parameter layout (restores reshard).
MAY_CHANGE = frozenset({
    "task.eval_size",  # a changed held-out set only loses the paired gain (with a warning)
    "task.on_error",  # skip or stop on a malformed row: the same tasks when the load succeeds
    "sandbox.workers", "sandbox.timeout_s", "sandbox.cpu_s", "sandbox.memory_mb",
    "sandbox.job_budget_s", "sandbox.min_isolation",
    "rl.num_steps",  # the run's length (and the cosine schedule's)
    "rl.episode_budget",  # the run's length in episodes
    "rl.micro_batches",  # the same update, accumulated in other slices
    "rl.pack_prefix", "rl.packed_buckets",  # the same update, in packed rows
    "model.attention_chunk",  # the same attention, computed in query chunks
    "model.causal_block",  # the same attention, without its all-masked score blocks
    "model.attention_backward",  # the same gradient, computed by a written-out backward
    "rl.prefill_widths",  # the same prefill over fewer padded slots
    # The same row keys, transform and stop rule, decoded in other batches: the same tokens
    # and log-probs up to float rounding, as `model.attention_chunk`.
    "rl.sampler", "rl.sampler_slots", "rl.sampler_compact_to",
    "rl.shared_prefill",  # the same prompts prefilled in two parts: float rounding only
    "rl.precompile_rows",  # when the update step compiles, not what it computes
    "rl.update_chunk_rows",  # the same update, accumulated over chunks of rows
    "rl.loss_slot_fractions",  # the same update, the last block at the loss tokens' slots
    "rl.prefix_cache_mb",  # how many saved rows are kept: which contexts are prefilled whole
    "rl.max_idle_batches", "rl.max_skipped_updates",
    # The judge's speed: when a final reward lands is `rl.final_reward_lag`'s, not the judge's.
    "workflow.final_reward_delay_s", "workflow.final_reward_jitter_s",
    "optim.max_consecutive_nonfinite",
    "eval.every", "eval.num_samples", "eval.k", "eval.temperature",
    "eval.headroom_tasks", "eval.headroom_train_tasks",
    "checkpoint.every", "checkpoint.max_to_keep", "checkpoint.keep_warmstart",
    "log.every", "log.tensorboard", "log.progress_bar", "log.plot",
    "log.transcripts_every", "log.transcripts", "log.wandb", "log.wandb_project",
    "log.wandb_mode",
    "mesh.logical_axis_rules", "mesh.collective_timeout_s",
})


class ConfigDriftError(ValueError):
  """A resume whose config changes fields of `FIXED` (the message lists each, old -> new)."""
  exit_code = exit_codes.CONFIG_DRIFT


@dataclasses.dataclass(frozen=True)
class Change:
  """One changed field: dotted path, saved value, new value (JSON forms: lists, not tuples)."""
  field: str
  old: Any
  new: Any

  def __str__(self) -> str:
    return f"{self.field}: {self.old!r} -> {self.new!r}"


def field_paths(cls=config_lib.TrainConfig, prefix: str = "") -> list[str]:
  """Every leaf field of the config dataclasses as a dotted path (`rl.group_size`)."""
  out = []
  for name, tp in typing.get_type_hints(cls).items():
    if dataclasses.is_dataclass(tp):
      out += field_paths(tp, f"{prefix}{name}.")
    else:
      out.append(prefix + name)
  return out


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in data.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def changes(saved: Mapping[str, Any], cfg: config_lib.TrainConfig) -> list[Change]:
  """Every field whose value in `cfg` differs from `saved` (a `config.json` dict)."""
  new = _flatten(json.loads(json.dumps(config_lib.to_dict(cfg))))
  defaults = _flatten(json.loads(json.dumps(config_lib.to_dict(config_lib.TrainConfig()))))
  old = _flatten(saved)
  return [Change(path, old.get(path, defaults[path]), new[path]) for path in sorted(new)
          if old.get(path, defaults[path]) != new[path]]


def check(saved: Mapping[str, Any], cfg: config_lib.TrainConfig, *,
          where: str = "the workdir") -> list[Change]:
  """Refuses a resume under `cfg` of a run saved under `saved`; else returns what changed.

  Args:
    saved: the saved run's config (`config.json` as a dict).
    cfg: the new run's config.
    where: the workdir, for the message.

  Returns:
    The changed fields of `MAY_CHANGE` (to be logged), sorted by path.

  Raises:
    ConfigDriftError: one message listing every changed field of `FIXED` with its old and new
      value.
  """
  found = changes(saved, cfg)
  refused = [c for c in found if c.field not in MAY_CHANGE]
  if refused:
    lines = "\n".join(f"  config.{c}" for c in refused)
    raise ConfigDriftError(
        f"cannot resume {where} with this config: {len(refused)} field(s) differ from the "
        f"saved config.json and change the meaning of the saved state:\n{lines}\n"
        f"Use the saved values, or a new workdir.")
  return found
