"""The staged replay's state as flat numpy arrays plus a JSON dict, and back: for checkpoints.

Every stored token row (a pending episode's segment, or a ready item) becomes one ragged row of
`rows_to_arrays`'s flat arrays (`lengths [R]` int64 and each field concatenated); the JSON dict
holds the groups, the episodes (each segment as its row index, version, reward, validity and
applied provisional advantage), the ready items in order (row index and per-segment arrays) and
the counters. `decode(*encode(...))` restores the state exactly.
"""

import collections
from typing import Any

import numpy as np

from agentic_grpo.checkpoint import records as checkpoint_records
from agentic_grpo.replay import records

# A stored row: `(tokens [L] int32, loss_mask [L] bool, behaviour_logprobs [L] f32,
# token_segment [L] int32)`.
Row = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_ROW_FIELDS = (("tokens", np.int32), ("loss_mask", np.bool_), ("behaviour_logprobs", np.float32),
               ("token_segment", np.int32))

Groups = dict[int, records.PendingGroup]
Episodes = dict[int, records.PendingEpisode]


def rows_to_arrays(rows: list[Row]) -> dict[str, np.ndarray]:
  """Ragged rows as flat arrays: `lengths [R]` int64 and each field concatenated."""
  arrays = {"lengths": np.array([r[0].shape[0] for r in rows], np.int64)}
  for j, (name, dtype) in enumerate(_ROW_FIELDS):
    arrays[name] = (np.concatenate([r[j] for r in rows]).astype(dtype) if rows
                    else np.zeros((0,), dtype))
  return arrays


def arrays_to_rows(arrays: dict[str, np.ndarray]) -> list[Row]:
  """The inverse of `rows_to_arrays`."""
  starts = np.concatenate([[0], np.cumsum(np.asarray(arrays["lengths"], np.int64))])
  return [tuple(np.asarray(arrays[name][int(a):int(b)], dtype) for name, dtype in _ROW_FIELDS)
          for a, b in zip(starts[:-1], starts[1:])]


def encode(groups: Groups, episodes: Episodes, ready: collections.deque[records.Item],
           counters: collections.Counter) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The replay's state as `(arrays, meta)`: flat numpy arrays and a JSON-serialisable dict.

  Args:
    groups: pending groups by id.
    episodes: pending episodes by id (with their provisional advantages, i.e. pending
      corrections).
    ready: ready items, oldest first.
    counters: the replay's counters.
  """
  rows = []  # (tokens, mask, blp, owner) per stored row, in a fixed order
  episodes_meta, items_meta = [], []
  for e, ep in episodes.items():
    segs = []
    for s in ep.segments:
      if s is None:
        segs.append(None)
        continue
      rows.append((s.tokens, s.loss_mask, s.behaviour_logprobs,
                   np.full(s.tokens.shape, -1, np.int32)))
      segs.append([len(rows) - 1, s.version, s.reward, s.valid, s.applied])
    episodes_meta.append([e, ep.group, ep.member, ep.final_reward, segs])
  for item in ready:
    rows.append((item.tokens, item.loss_mask, item.behaviour_logprobs, item.token_segment))
    items_meta.append([item.kind, len(rows) - 1, item.seg_episode.tolist(),
                       item.seg_stage.tolist(), item.seg_version.tolist(),
                       [float(a) for a in item.seg_advantage]])
  arrays = rows_to_arrays(rows)
  meta = {
      "groups": [[g, grp.episodes, grp.stages_reported, grp.finished]
                 for g, grp in groups.items()],
      "episodes": episodes_meta,
      "items": items_meta,
      "counters": dict(counters),
  }
  return arrays, meta


def decode(arrays: dict[str, np.ndarray], meta: dict[str, Any]
           ) -> tuple[Groups, Episodes, collections.deque[records.Item], collections.Counter]:
  """The inverse of `encode`: `(groups, episodes, ready, counters)`.

  A `meta` without `counters` (an earlier version's) starts them at zero: they only feed
  logged metrics.

  Raises:
    checkpoint_records.RecordError: `meta` or `arrays` lacks anything else of `encode`'s.
  """
  meta = checkpoint_records.read(meta, "meta.replay", required=("groups", "episodes", "items"),
                                 defaults={"counters": {}})
  arrays = checkpoint_records.read(arrays, "host arrays replay",
                                   required=("lengths",) + tuple(n for n, _ in _ROW_FIELDS))
  row = arrays_to_rows(arrays).__getitem__
  groups = {int(g): records.PendingGroup([int(e) for e in eps], [int(c) for c in rep], int(fin))
            for g, eps, rep, fin in meta["groups"]}
  episodes = {}
  for e, g, member, final, segs in meta["episodes"]:
    segments = []
    for s in segs:
      if s is None:
        segments.append(None)
        continue
      idx, version, reward, ok, applied = s
      t, m, b, _ = row(idx)
      segments.append(records.Segment(t, m, b, int(version), float(reward), bool(ok),
                                      float(applied)))
    episodes[int(e)] = records.PendingEpisode(int(g), int(member), segments,
                                              None if final is None else float(final))
  ready = collections.deque()
  for kind, idx, seg_e, seg_s, seg_v, seg_a in meta["items"]:
    t, m, b, owner = row(idx)
    ready.append(records.Item(kind, t, m, b, owner, np.array(seg_e, np.int64),
                              np.array(seg_s, np.int64), np.array(seg_v, np.int64),
                              np.array(seg_a, np.float32)))
  counters = collections.Counter({k: v for k, v in meta["counters"].items()})
  return groups, episodes, ready, counters
