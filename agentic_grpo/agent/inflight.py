"""Episode batches in flight in the agent loop, and their checkpoint encoding.

An `InFlightBatch` is one batch of `N = B * G` episodes between stages: its ids, its workflow
and episodes, the token context of every episode, the stages sampled and harvested so far
(`Sampled`: generated ids and behaviour log-probs, ragged per episode) and the one sampled
stage whose sandbox job may be running. Once its last stage is harvested it leaves its slot and
waits for its final reward (`final_job`, fed to the replay at the loop's harvest `final_due`).

A checkpoint records only what the sampler produced: every stage's generated ids and
log-probs (`encode`: flat arrays, one ragged row per episode and stage) and each batch's ids
and stage list (a JSON entry). Everything else (contexts, the workflow's episodes) is rebuilt
by replaying the workflow on those outputs (`AgentLoop.load_state_dict`), which reads the rows
back in order (`decode_rows`, `decode_stages`).
"""

import concurrent.futures
import dataclasses
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.checkpoint import records

# One recorded row: `(generated ids [M] int32, behaviour log-probs [M] float32)`.
Row = tuple[np.ndarray, np.ndarray]
# The keys of an `encode` entry, all required to restore the batch.
ENTRY_KEYS = ("batch_id", "positions", "group_ids", "episode_ids", "done", "stages", "pending")
# The key of an entry awaiting its final reward: the loop harvest at which it is due (absent or
# None for a batch in a slot).
FINAL_DUE = "final_due"


@dataclasses.dataclass
class Sampled:
  """A sampled stage of a batch (harvested or not yet)."""
  stage: int
  version: int
  gen: list[np.ndarray]        # per episode: generated ids (stop token included)
  logprobs: list[np.ndarray]   # per episode: behaviour log-probs of `gen`
  sampled: np.ndarray          # [N] bool: False where the context was too long to sample


@dataclasses.dataclass
class InFlightBatch:
  """One episode batch in flight."""
  batch_id: int
  positions: list[int]               # task-stream positions of the B tasks
  group_ids: list[int]
  episode_ids: list[int]             # N = B * G, group-major
  workflow: workflow_lib.Workflow
  episodes: list[episodes_lib.Episode]
  context: list[list[int]]           # per episode: tokens so far (incl. the open stage's opening)
  history: list[Sampled] = dataclasses.field(default_factory=list)  # harvested stages
  pending: Optional[Sampled] = None
  job: Optional[concurrent.futures.Future] = None
  done: bool = False
  # After the last stage's harvest: the final judgement's job and the loop harvest at which its
  # result is fed to the replay.
  final_job: Optional[concurrent.futures.Future] = None
  final_due: Optional[int] = None

  @property
  def next_stage(self) -> int:
    return len(self.history) + (self.pending is not None)


def encode(slots: Sequence[Optional[InFlightBatch]]
           ) -> tuple[dict[str, np.ndarray], list[Optional[dict[str, Any]]]]:
  """The batches' sampled stages as `(arrays, entries)`.

  Returns:
    `arrays`: `gen` int32 and `logprobs` float32, every recorded row concatenated (batch by
    batch, stage by stage, episode by episode), and `lengths [R]` int64; `entries`: per slot,
    None for an empty one, else a JSON-serialisable dict of its ids, `done`, its stages
    `[stage, version, sampled]` and whether the last is `pending`.
  """
  gen_all, lp_all, lengths = [], [], []
  entries = []
  for slot in slots:
    if slot is None:
      entries.append(None)
      continue
    stages = slot.history + ([slot.pending] if slot.pending is not None else [])
    for s in stages:
      for g, lp in zip(s.gen, s.logprobs):
        gen_all.append(g)
        lp_all.append(lp)
        lengths.append(len(g))
    entries.append({
        "batch_id": slot.batch_id, "positions": slot.positions, "group_ids": slot.group_ids,
        "episode_ids": slot.episode_ids, "done": slot.done,
        "stages": [[s.stage, s.version, s.sampled.tolist()] for s in stages],
        "pending": slot.pending is not None, FINAL_DUE: slot.final_due,
    })
  cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros((0,), dt)
  arrays = {"gen": cat(gen_all, np.int32), "logprobs": cat(lp_all, np.float32),
            "lengths": np.asarray(lengths, np.int64)}
  return arrays, entries


def decode_rows(arrays: dict[str, np.ndarray]) -> Iterator[Row]:
  """The recorded rows of `encode`'s arrays, in its order (lazily).

  Raises:
    checkpoint_records.RecordError: `arrays` lacks `gen`, `logprobs` or `lengths`.
  """
  arrays = records.read(arrays, "host arrays loop", required=("gen", "logprobs", "lengths"))
  lengths = np.asarray(arrays["lengths"], np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  return ((np.asarray(arrays["gen"][int(starts[i]):int(starts[i + 1])], np.int32),
           np.asarray(arrays["logprobs"][int(starts[i]):int(starts[i + 1])], np.float32))
          for i in range(len(lengths)))


def decode_stages(entry: dict[str, Any], rows: Iterator[Row], num_rows: int) -> list[Sampled]:
  """One batch's stages from its `encode` entry; consumes its `num_rows` rows per stage."""
  stages = []
  for stage, version, sampled in entry["stages"]:
    gens, lps = zip(*[next(rows) for _ in range(num_rows)])
    stages.append(Sampled(int(stage), int(version), list(gens), list(lps),
                          np.asarray(sampled, bool)))
  return stages
