"""Where the policy comes from: a randomly initialised preset or a Hugging Face checkpoint.

`open_model(model_section)` resolves the source and checks everything that
can be checked on the host (config, tensor headers, tokenizer, dtypes,
lengths) without spending device memory; it returns a `ModelSource` whose
`params(shardings, rng)` then builds the parameters in their shards (random
for `preset`, read from the checkpoint's safetensors for `hf`). `load_model`
does both.

Paths for `source='hf'`:
- a local directory: used as it is;
- `gs://bucket/dir` (any `etils.epath` URL): the directory's files are copied
  to a local cache directory first (safetensors are read memory-mapped), then
  loaded as a local one;
- `hf://org/name[@revision]`: downloaded through `huggingface_hub` (weights,
  config and tokenizer files only) into its cache; offline, a clear error.
"""

import dataclasses
import hashlib
import os
import tempfile
from typing import Any, Callable, Optional

from flax import nnx

from agentic_grpo import errors
from agentic_grpo import registry
from agentic_grpo.models import hf_import
from agentic_grpo.models import placement
from agentic_grpo.models import presets
from agentic_grpo.models import tokenizers
from agentic_grpo.models import transformer

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Files fetched from a remote checkpoint (no other weights formats, no README/images).
REMOTE_PATTERNS = ("*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer.model")


@dataclasses.dataclass
class ModelSource:
  """A checked model source; holds no parameters yet.

  Attributes:
    kind: `preset` or `hf`.
    model_config: the model shape and dtypes.
    graphdef: the static model structure.
    tokenizer: `ByteTokenizer` (preset) or `HFTokenizer` (hf).
    local_dir: the checkpoint's local directory (hf), else None.
    checkpoint: the checked `hf_import.HFCheckpoint` (hf), else None.
  """
  kind: str
  model_config: transformer.ModelConfig
  graphdef: nnx.GraphDef
  tokenizer: Any
  local_dir: Optional[str] = None
  checkpoint: Optional[hf_import.HFCheckpoint] = None

  def params(self, sharded: placement.ShardedModel, rng) -> nnx.State:
    """The parameters built in `sharded.param_shardings`.

    Args:
      sharded: `placement.shard_model(self.model_config, mesh)` or the
        learner's (`learner.learner_shardings(...)[0]`).
      rng: key or int seed of a preset's random initialisation (as
        `placement.init_params`); unused for a checkpoint.
    """
    if self.checkpoint is None:
      return placement.init_params(sharded, self.model_config, rng)
    return hf_import.load_params(self.checkpoint, sharded.param_shardings)


def resolve_path(path: str, *, cache_dir: Optional[str] = None) -> str:
  """A local directory holding the checkpoint at `path` (see the module doc).

  Raises:
    errors.InputError (a ValueError): an empty path; `hf://` while offline or for an unknown
      repo; a local or remote path that is not a directory.
  """
  if not path:
    raise errors.InputError("config.model.path is empty; name a checkpoint directory")
  if path.startswith("hf://"):
    return _download_hf(path[len("hf://"):], cache_dir)
  if "://" in path:
    return _copy_remote(path, cache_dir)
  if not os.path.isdir(path):
    raise errors.InputError(f"config.model.path {path!r} is not a directory: set "
                            f"--config.model.path to a checkpoint directory (config.json, "
                            f"*.safetensors, tokenizer.json), gs://... or hf://org/name")
  return path


def _download_hf(spec: str, cache_dir: Optional[str]) -> str:
  repo, _, revision = spec.partition("@")
  if repo.count("/") != 1:
    raise errors.InputError(f"hf:// path must be hf://org/name[@revision], got 'hf://{spec}'")
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hub_errors  # pylint: disable=g-import-not-at-top
  try:
    return huggingface_hub.snapshot_download(repo, revision=revision or None,
                                             allow_patterns=list(REMOTE_PATTERNS),
                                             cache_dir=cache_dir)
  except (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled, OSError) as e:
    raise errors.InputError(
        f"cannot download hf://{spec}: this machine looks offline or the Hub is unreachable "
        f"({type(e).__name__}: {e}). Download the checkpoint where there is network "
        f"(`huggingface-cli download {repo}`) and set config.model.path to its local or gs:// "
        f"directory.") from e
  except hub_errors.HfHubHTTPError as e:
    raise errors.InputError(f"cannot download hf://{spec}: {e}") from e


def _copy_remote(path: str, cache_dir: Optional[str]) -> str:
  from etils import epath  # pylint: disable=g-import-not-at-top
  src = epath.Path(path)
  if not src.is_dir():
    raise errors.InputError(f"config.model.path {path!r} is not a directory")
  root = cache_dir or os.path.join(tempfile.gettempdir(), "agentic_grpo_checkpoints")
  local = os.path.join(root, hashlib.sha256(path.encode()).hexdigest()[:16])
  os.makedirs(local, exist_ok=True)
  for f in src.iterdir():
    if f.is_file() and any(epath.Path(f.name).match(p) for p in REMOTE_PATTERNS):
      target = os.path.join(local, f.name)
      if not os.path.isfile(target) or os.path.getsize(target) != f.stat().length:
        f.copy(target, overwrite=True)
  return local


# Model sources by name (`config.model.source`): each is
# `(section, *, dtype, min_seq_len, cache_dir) -> ModelSource`, checked, no device memory spent.
MODEL_SOURCES = registry.Registry("model source")


@MODEL_SOURCES.register("preset")
def _open_preset(section: Any, *, dtype: Optional[str], min_seq_len: int,
                 cache_dir: Optional[str]) -> ModelSource:
  """A `models.transformer` preset with the byte tokenizer (random init from the run's seed)."""
  del cache_dir
  overrides = section.overrides()
  tok = tokenizers.ByteTokenizer()
  overrides.setdefault("max_seq_len", max(min_seq_len, 512))
  if dtype:
    overrides.update(param_dtype=dtype, dtype=dtype)
  model_config = presets.get_model_config(section.preset, vocab_size=tok.vocab_size,
                                          **overrides)
  return ModelSource("preset", model_config, transformer.abstract_model(model_config)[0], tok)


@MODEL_SOURCES.register("hf")
def _open_hf(section: Any, *, dtype: Optional[str], min_seq_len: int,
             cache_dir: Optional[str]) -> ModelSource:
  """A Hugging Face checkpoint directory (local, `gs://` or `hf://`) with its own tokenizer."""
  del min_seq_len  # checked by `open_model` for every source
  overrides = section.overrides()
  local = resolve_path(section.path, cache_dir=cache_dir)
  checkpoint = hf_import.open_hf_checkpoint(local, param_dtype=dtype)
  trained = checkpoint.config.max_seq_len  # config.json max_position_embeddings
  if overrides.get("max_seq_len", 0) > trained:
    raise errors.InputError(
        f"config.model.max_seq_len={overrides['max_seq_len']} exceeds the checkpoint's "
        f"max_position_embeddings={trained} ({os.path.join(local, 'config.json')}): the model "
        f"holds no positions past it; set --config.model.max_seq_len to at most {trained} (0: "
        f"the checkpoint's) and keep rl.buckets[-1] + workflow.max_new_tokens within it")
  if overrides:  # max_seq_len, attention_chunk, causal_block, attention_backward
    checkpoint = dataclasses.replace(checkpoint, config=dataclasses.replace(
        checkpoint.config, **overrides))
  tok = _checkpoint_tokenizer(local, checkpoint.config)
  return ModelSource("hf", checkpoint.config, transformer.abstract_model(checkpoint.config)[0],
                     tok, local, checkpoint)


def open_model(section: Any, *, min_seq_len: int = 0, cache_dir: Optional[str] = None
               ) -> ModelSource:
  """Resolves and checks the model source of a run; allocates no device memory.

  Args:
    section: a `config.ModelSection` (`source`, `path`, `param_dtype`, `preset`
      and shape overrides).
    min_seq_len: the longest sequence the run uses (largest rl bucket plus
      `workflow.max_new_tokens`); a preset without a `max_seq_len` override
      gets `max(min_seq_len, 512)`.
    cache_dir: where remote checkpoints are copied / downloaded.

  Raises:
    errors.InputError (a ValueError): an unknown source or preset, a bad path, a checkpoint
      that fails `hf_import.open_hf_checkpoint`'s checks, a `config.model.max_seq_len` past
      the checkpoint's `max_position_embeddings`, a checkpoint directory without
      `tokenizer.json` or with unreadable tokenizer files, a tokenizer whose vocabulary is
      larger than the embedding, a tokenizer without eos id, or a model shorter than
      `min_seq_len`; each names the field or file, and the fix.
  """
  dtype = _DTYPES.get(section.param_dtype) if section.param_dtype else None
  if section.param_dtype and dtype is None:
    raise errors.InputError(f"config.model.param_dtype must be one of {sorted(_DTYPES)} or '', got "
                     f"{section.param_dtype!r}")
  source = MODEL_SOURCES.get(section.source)(
      section, dtype=dtype, min_seq_len=min_seq_len, cache_dir=cache_dir)
  if source.model_config.max_seq_len < min_seq_len:
    held = source.model_config.max_seq_len
    where = ("config.model.max_seq_len" if section.max_seq_len else
             "the checkpoint's max_position_embeddings" if source.kind == "hf" else
             "the preset's max_seq_len")
    raise errors.InputError(
        f"config.model.max_seq_len must be >= rl.buckets[-1] + workflow.max_new_tokens = "
        f"{min_seq_len}, got {held} ({where}): the model's context is too short for the "
        f"buckets; lower --config.rl.buckets or --config.workflow.max_new_tokens so that "
        f"they add up to at most {held}"
        + (", or raise --config.model.max_seq_len" if source.kind != "hf" else ""))
  return source


def _checkpoint_tokenizer(local: str, config: transformer.ModelConfig
                          ) -> tokenizers.HFTokenizer:
  if not os.path.isfile(os.path.join(local, "tokenizer.json")):
    raise errors.InputError(
        f"config.model.path {local!r} has no tokenizer.json: copy the checkpoint's tokenizer "
        f"files (tokenizer.json, tokenizer_config.json) into it, e.g. from the model's "
        f"Hugging Face repository")
  try:
    tok = tokenizers.HFTokenizer(local)
  except ValueError as e:  # its files are the input: unreadable JSON, unknown special tokens
    raise errors.InputError(f"the tokenizer files in {local!r} cannot be used: {e}") from e
  if tok.vocab_size > config.vocab_size:
    raise errors.InputError(f"the tokenizer in {local!r} has {tok.vocab_size} ids, more than the "
                     f"model's embedding ({config.vocab_size} rows, config.json vocab_size)")
  if not tok.eos_ids:
    raise errors.InputError(f"the tokenizer in {local!r} has no eos token (tokenizer_config.json "
                     f"eos_token or generation_config.json eos_token_id): generation could "
                     f"not end")
  if tok.pad_id is None:  # e.g. Llama 3: pad with the first eos id (masked out anyway)
    tok.pad_id = tok.eos_ids[0]
  return tok


def load_model(section: Any,
               shard: Callable[[transformer.ModelConfig], placement.ShardedModel],
               rng, *, min_seq_len: int = 0, cache_dir: Optional[str] = None
               ) -> tuple[transformer.ModelConfig, nnx.GraphDef, nnx.State, Any]:
  """`open_model` then its parameters: `(model_config, graphdef, params, tokenizer)`.

  Args:
    section: a `config.ModelSection`.
    shard: `model_config -> placement.ShardedModel` (e.g.
      `lambda c: learner.learner_shardings(c, mesh, optimizer, rules)[0]`).
    rng: the key of a preset's random initialisation (unused for `hf`).
    min_seq_len, cache_dir: as `open_model`.

  Raises:
    ValueError: as `open_model`, before any device memory is spent.
  """
  source = open_model(section, min_seq_len=min_seq_len, cache_dir=cache_dir)
  params = source.params(shard(source.model_config), rng)
  return source.model_config, source.graphdef, params, source.tokenizer
