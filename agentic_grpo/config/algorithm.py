"""The config section of the Agentic GRPO phase (`RLSection`); the loss (`learner/sections.py`),
correction and replay (`replay/sections.py`) sections live with their owners."""

import dataclasses

from agentic_grpo import field_checks as checks
from agentic_grpo.core import types as core_types
from agentic_grpo.models import prefix_cache

# The samplers of `rl.sampler`.
SAMPLERS = ("static", "continuous")


@dataclasses.dataclass(frozen=True)
class RLSection:
  """The Agentic GRPO phase.

  `num_steps` learner updates; each episode batch is `tasks_per_batch` tasks (B) times
  `group_size` attempts (G); `batches_in_flight` episode batches overlap (sampling, sandbox and
  learning); each update takes `rows_per_update` replay rows (N), split into `micro_batches`.
  Rows are padded to the smallest of `buckets` that fits (each bucket compiles once).
  `max_idle_batches` consecutive episode batches without any learning signal (every group's
  rewards equal) end the phase early (0 = never). `max_skipped_updates` consecutive updates
  skipped by the non-finite guard (warm-start or RL) stop the run with an error (0 = never); it
  must not exceed `optim.max_consecutive_nonfinite`, past which the guard applies the update.

  `dynamic_sampling` (DAPO's dynamic sampling, Yu et al., 2025, §3.2) keeps every update's
  batch full of groups that carry signal. A group *carries no signal* when all its advantages
  are 0: outcome-only, its final rewards tie; with stage rewards, its stage rewards tie at
  every stage (after `correction.baseline`) and its target advantages are 0 too. Such a group,
  and a stage of a group whose provisional advantages are all 0, readies no row (even with
  `replay.skip_zero_advantage=False`, which otherwise keeps zero rows); finished groups without
  signal are counted (`loop/dynamic_sampling_dropped_groups`). Today's rows already have
  non-zero advantages when zero rows are skipped (the default); what the option adds is the
  cadence: an update waits until every process has its full share of `rows_per_update` rows
  in one length bucket, while the agent loop samples further episode batches from the task
  stream, instead of flushing the rows it has (a partial update) before each sample phase. So
  a stage's provisional update may land after the batch's next stage is sampled. The cap on
  extra sampling: once `dynamic_sampling_max_batches` episode batches have finished while rows
  waited, the rows there are go as one partial update (`counts/dynamic_sampling_partial_updates`).

  `pass_rate_filter=(lo, hi)` keeps training at the edge of competence: a finished group whose
  pass rate (the mean of its final rewards; the share that passed under `all_pass` rewards)
  lies outside `[lo, hi]` is not trained on (`loop/pass_rate_filtered_groups`): its target
  advantage is 0, so it readies no outcome row, and the provisional updates its stages already
  received are withdrawn by their corrections (with `correction.enabled`; without, they stay).
  Online accuracy filtering as in PRIME (Cui et al., 2025, "Process Reinforcement through
  Implicit Rewards", which keeps prompts with accuracy in [0.2, 0.8]) and the filter of
  DAPO's dynamic sampling (0 < accuracy < 1, which for 0/1 rewards is the no-signal rule
  above). It filters after the fact, when the group's outcome is known: with an endless stream
  of fresh tasks (the synthetic default) that is all it can do; a stream that repeats tasks (a
  finite data set, `task.train_size` > 0) keeps no per-task memory, so a filtered task is
  sampled again when it recurs (and trained on if its pass rate has moved into the band). With
  `dynamic_sampling`, the updates wait for rows of groups inside the band.

  `pack_prefix` (shared-prefix packing, tree attention: `replay.batching`, `core.packing`)
  lays out an update's rows anew: rows that share a prefix (the G attempts of a task share its
  prompt; a stage's rows the episode's context) hold it once, `[prefix | suffix_1 | suffix_2
  | ...]`, each suffix attending to the prefix and to itself at the positions of its own row.
  Every token's log-prob is its row's (up to float reordering), so the update takes the same
  rows, with the same loss and gradient, in fewer token slots: with the tiny default most of a
  row is its prompt. The rows of an update taken from length bucket `buckets[i]` are packed
  into rows of `packed_buckets[i]` tokens (`()`: twice each bucket; one length `(L,)`: rows of
  `max(L, bucket)` for every bucket, so that the buckets share one row shape), a power-of-two
  row count as without packing, so packing compiles no more update steps. A row holds the
  trees (a shared prefix and its suffixes) of several groups side by side (`core.packing`). The prefix ends before any
  packed row's first loss token. It applies only where the loss is additive over a row's tokens
  (`core.losses.segments_additive`: not with `loss.ratio_level='sequence'` nor
  `loss.aggregation='seq_mean_token_mean'`, where it is silently off, as
  `replay.pack_corrections`); Dr. GRPO's normaliser stays `rows_per_update · max_tokens`.

  `final_reward_lag` is when a batch's final reward lands in the replay, counted in the agent
  loop's harvests (one per visit of a batch slot, `agent.loop`): the batch's slot takes a new
  batch as soon as its last stage is scored, its final judgement (the hidden tests and any
  `workflow.final_reward_delay_s`) runs in a queue of its own, and its result is fed to the
  replay `final_reward_lag` harvests later (waiting for the judge there if it is not done;
  `final/wait_s`). 0 feeds it right after the last stage (the loop waits for the whole
  judgement). Counted in harvests, not seconds, so that a run is deterministic and processes
  stay in lock-step whatever the judge's speed; the policy versions it spans are reported
  (`final/latency_versions`), and its corrections and outcome rows meet the staleness bound
  (`correction.max_staleness`) like any other.

  `sampler` picks how the agent loop's and evaluation's sampler decodes a call's `[N, P]`
  prompts: `'static'` (`models.sampler.sample`) decodes the N rows together until the longest
  stops; `'continuous'` (`models.continuous.sample`) decodes them in `sampler_slots` slots,
  refilled as rows finish, its cache kept at the width the live rows need. Both draw row `r`
  with the same key (`jax.random.fold_in(key(seed), counter)`, split per row), the same
  transform, stop rule and behaviour log-probs, so they give the same tokens up to float
  rounding (a prompt prefilled at another padded width, attention over a cache of another
  length: log-probs agree to about 1e-6; a token differs only where two candidates are that
  close). `'continuous'` runs in a single process only (its host loop needs every row of the
  call): a multi-process run with it stops at start-up.

  `reuse_prefix` lets the continuous sampler start a stage from the saved KV cache rows of the
  episode's previous stage (`models.prefix_cache`): stage k+1's context is stage k's context,
  its generated ids and the next opening, so only the new tokens are prefilled. Each training
  stage's conversations are saved under `(episode, stage)` in a pool of `prefix_cache_mb`
  MiB (least recently used evicted first; a conversation not in the pool is prefilled whole);
  evaluation never reuses. `'never'` (default) prefills every context whole; `'same_version'`
  reuses rows computed by the policy version that samples the stage (the tokens and
  log-probs of a full prefill, up to float rounding: an update in between makes a miss);
  `'always'` also reuses rows of earlier versions, so the behaviour log-probs are those of a
  context partly computed by an older policy (the importance ratio against the learner's
  recomputed log-probs covers the difference). The agent loop counts the prompt tokens taken
  from saved rows and the hits, misses and saves (`loop/prefix_reused_tokens`,
  `loop/prefix_hits`, `loop/prefix_misses`, `loop/prefix_mismatches`, `loop/prefixes_saved`;
  `loop/prefix_stale_hits`: hits on rows of an earlier version, with `'always'`). It needs
  `sampler='continuous'` and a mesh of one device (saved rows are not sharded): a run that asks
  otherwise stops at start-up.

  `shared_prefill` (the static sampler, one process): a call whose rows come in groups of
  `group_size` (a training stage's attempts at one task; evaluation's headroom groups)
  prefills each group's longest common prompt prefix once and each row's rest after it
  (`models.sampler.sample`'s `prefix_group`), when its estimated work is less than
  prefilling every prompt whole (`models.shared_prefill.layout`): a stage's prompts share the
  task prompt, so its prefill shrinks up to G-fold. Same tokens and log-probs up to float rounding.

  Attributes:
    num_steps: learner updates of the RL phase.
    tasks_per_batch: tasks per episode batch (B).
    group_size: attempts per task (G), the GRPO group.
    batches_in_flight: episode batches sampled, scored and learned from concurrently.
    rows_per_update: replay rows per learner update (N).
    micro_batches: gradient-accumulation slices of an update (divides rows_per_update).
    ppo_epochs: optimizer steps per update on the same rows (>= 1): GRPO's μ iterations per
      batch (Shao et al., 2024, "DeepSeekMath", Algorithm 1; verl's `ppo_epochs`, TRL's
      `num_iterations`). Every pass's importance ratio is taken against the behaviour
      log-probs the rows were sampled with, so passes after the first are clipped by PPO's
      trust region; the learning-rate schedule spans `num_steps * ppo_epochs` optimizer steps
      (its warm-up `optim.warmup_steps * ppo_epochs`). An update's metrics are its last pass's.
    update_chunk_rows: 0 (off): an update is one compiled step per row bucket; C >= 1: an
      update of N rows is `ceil(N / C)` gradient programs of C rows each, accumulated, then one
      optimizer step (`learner.make_chunked_update`): one compiled gradient program per row
      length whatever N is, and no padding rows past the last chunk's. The same update up to
      float summation order; needs `micro_batches=1` and C dividing `rows_per_update`. A
      chunk is rounded up to whole shards of the mesh's batch axes (`DeviceSide`).
    loss_slot_fractions: `()` (off): an update computes the model's last block and output
      head at every slot of its rows; fractions in (0, 1]: at the slots that score a loss token
      only (`UpdateBatch.loss_slots`, `learner.loss_slots`), in the smallest of these
      fractions of the row length (rounded up to 8 slots) that holds the row with the most
      loss tokens of an update (or chunk, with `update_chunk_rows`); every slot when none
      does. The same update up to float rounding; each width compiles its own program (ahead
      with `precompile_rows`).
    temperature: sampling temperature of the behaviour policy (> 0).
    top_k: top-k sampling (0 = off).
    top_p: nucleus sampling mass, in (0, 1].
    buckets: padded sequence lengths, strictly increasing (each compiles once).
    prefill_widths: `()` (off), or more widths for the static sampler's whole-prompt prefill,
      below a prompt bucket: a call whose longest prompt (agreed by every process) fits one
      prefills at the smallest such width above the next smaller bucket, and its cache is
      widened to the bucket's for the bucket's decode program (`models.sampler.sample`'s
      `prefill_width`). Fewer padded slots for the same tokens and log-probs up to float
      rounding; each width's prefill program compiles ahead (`train.sampling`).
    max_idle_batches: end the RL phase after this many batches without learning signal (0 =
      never).
    max_skipped_updates: stop the run after this many non-finite updates in a row (0 = never).
    episode_budget: end the RL phase once this many training episodes (all processes) have
      finished, even before `num_steps` updates (0 = no budget): runs whose updates consume
      episodes at different rates (outcome-only vs staged) compared at equal rollouts.
    dynamic_sampling: drop groups without signal and update only on full batches (DAPO's
      dynamic sampling; see above).
    dynamic_sampling_max_batches: with dynamic_sampling, the most episode batches that finish
      while rows wait for a full update before they go as a partial one (0 = no cap).
    pass_rate_filter: `()` (off) or `(lo, hi)`, 0 <= lo <= hi <= 1: groups whose pass rate
      lies outside [lo, hi] are not trained on (see above).
    final_reward_lag: agent-loop harvests from a batch's last stage being scored to its final
      reward landing in the replay (>= 0; see above).
    pack_prefix: shared-prefix packing of an update's rows (see above).
    packed_buckets: with pack_prefix, the packed row length of each of `buckets` (as many,
      each at least its bucket); `()` = twice each bucket; `(L,)` = `max(L, bucket)` for
      every bucket.
    sampler: `'static'` or `'continuous'` batching of the sampler (see above).
    sampler_slots: with sampler='continuous', rows decoded at once (0 = every row of a
      call); a multiple of the mesh's batch axes' size.
    reuse_prefix: `'never'`, `'same_version'` or `'always'` (`models.prefix_cache.
      REUSE_PREFIX`): whether a training stage starts from its previous stage's saved cache
      rows (see above).
    prefix_cache_mb: with reuse_prefix, the saved rows' budget in MiB (>= 1).
    shared_prefill: the static sampler prefills a group's shared prompt prefix once (see
      above); ignored with sampler='continuous' and in a multi-process run.
    sampler_compact_to: the static sampler's decode compaction (`models.sampler.sample`'s
      `compact_to`): once at most this many of a call's rows (all processes') are still
      generating, only those rows are decoded on; 0 = off, and no effect on calls of at most
      this many rows. Same tokens and log-probs up to float rounding; ignored with
      sampler='continuous' (which refills its slots instead).
    precompile_rows: update row counts (this process's) whose update step compiles in a
      background thread during the warm-start's last evaluation (`train.device.DeviceSide.
      compile_rl_updates`), at each packed row length or bucket: the RL phase's first
      updates of those shapes then run at once. `()` = compile on first use. With
      `update_chunk_rows`, any row count compiles the chunk's programs instead.
  """
  num_steps: int = 60
  tasks_per_batch: int = 8
  group_size: int = 8
  batches_in_flight: int = 2
  rows_per_update: int = 64
  micro_batches: int = 1
  ppo_epochs: int = 1
  update_chunk_rows: int = 0
  loss_slot_fractions: tuple[float, ...] = ()
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  buckets: tuple[int, ...] = (128, 256)
  prefill_widths: tuple[int, ...] = ()
  max_idle_batches: int = 50
  max_skipped_updates: int = 3
  episode_budget: int = 0
  dynamic_sampling: bool = False
  dynamic_sampling_max_batches: int = 10
  pass_rate_filter: tuple[float, ...] = ()
  final_reward_lag: int = 0
  pack_prefix: bool = False
  packed_buckets: tuple[int, ...] = ()
  sampler: str = "static"
  sampler_slots: int = 0
  reuse_prefix: str = "never"
  prefix_cache_mb: int = 1024
  shared_prefill: bool = True
  sampler_compact_to: int = 0
  precompile_rows: tuple[int, ...] = ()

  def packed_lengths(self) -> dict[int, int]:
    """`{bucket: packed row length}`: `packed_buckets`, twice each of `buckets` for `()`, or
    `max(L, bucket)` for `(L,)`."""
    packed = tuple(self.packed_buckets) or tuple(2 * b for b in self.buckets)
    if len(packed) == 1:
      packed = tuple(max(int(packed[0]), int(b)) for b in self.buckets)
    return {int(b): int(n) for b, n in zip(self.buckets, packed)}

  def validate(self, path: str) -> None:
    checks.choice(f"{path}.sampler", self.sampler, SAMPLERS)
    checks.check(isinstance(self.sampler_slots, int) and self.sampler_slots >= 0,
                 f"{path}.sampler_slots", "must be an int >= 0 (0 = every row of a call)",
                 self.sampler_slots)
    checks.choice(f"{path}.reuse_prefix", self.reuse_prefix, prefix_cache.REUSE_PREFIX)
    checks.check(isinstance(self.prefix_cache_mb, int) and not isinstance(
        self.prefix_cache_mb, bool) and self.prefix_cache_mb >= 1, f"{path}.prefix_cache_mb",
                 "must be an int >= 1 (MiB of saved prefix rows)", self.prefix_cache_mb)
    checks.check(self.reuse_prefix == "never" or self.sampler == "continuous",
                 f"{path}.reuse_prefix", f"needs rl.sampler='continuous' (saved prefixes are "
                 f"the continuous sampler's), got rl.sampler={self.sampler!r}",
                 self.reuse_prefix)
    checks.check(isinstance(self.shared_prefill, bool), f"{path}.shared_prefill",
                 "must be a bool", self.shared_prefill)
    checks.check(isinstance(self.sampler_compact_to, int) and not isinstance(
        self.sampler_compact_to, bool) and self.sampler_compact_to >= 0,
                 f"{path}.sampler_compact_to", "must be an int >= 0 (0 = off)",
                 self.sampler_compact_to)
    checks.check(all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r
                     for r in self.precompile_rows), f"{path}.precompile_rows",
                 "must be row counts >= 1", tuple(self.precompile_rows))
    packed = tuple(self.packed_buckets)
    checks.check(packed == () or (len(packed) == 1 and int(packed[0]) >= 1) or (
        len(packed) == len(self.buckets) and all(
            n >= b for b, n in zip(self.buckets, packed))), f"{path}.packed_buckets",
                 f"must be () (twice each of rl.buckets), one length L >= 1 (max(L, bucket) for "
                 f"every bucket) or one length per rl.buckets entry {tuple(self.buckets)}, each "
                 f"at least its bucket", packed)
    checks.check(self.dynamic_sampling_max_batches >= 0, f"{path}.dynamic_sampling_max_batches",
                 "must be >= 0 (0 = no cap)", self.dynamic_sampling_max_batches)
    checks.check(self.pass_rate_filter == () or (
        len(self.pass_rate_filter) == 2
        and 0.0 <= self.pass_rate_filter[0] <= self.pass_rate_filter[1] <= 1.0),
                 f"{path}.pass_rate_filter", "must be () (off) or (lo, hi) with "
                 "0 <= lo <= hi <= 1", self.pass_rate_filter)
    checks.check(self.final_reward_lag >= 0, f"{path}.final_reward_lag", "must be >= 0",
                 self.final_reward_lag)
    checks.check(self.episode_budget >= 0, f"{path}.episode_budget",
                 "must be >= 0 (0 = no budget)", self.episode_budget)
    checks.check(self.max_skipped_updates >= 0, f"{path}.max_skipped_updates",
                 "must be >= 0 (0 = never stop)", self.max_skipped_updates)
    checks.check(self.max_idle_batches >= 0, f"{path}.max_idle_batches", "must be >= 0",
                 self.max_idle_batches)
    checks.check(self.num_steps >= 0, f"{path}.num_steps", "must be >= 0", self.num_steps)
    checks.check(self.tasks_per_batch >= 1, f"{path}.tasks_per_batch", "must be >= 1",
                 self.tasks_per_batch)
    checks.check(self.group_size >= 2, f"{path}.group_size", "must be >= 2", self.group_size)
    checks.check(self.batches_in_flight >= 1, f"{path}.batches_in_flight", "must be >= 1",
                 self.batches_in_flight)
    checks.check(self.rows_per_update >= 1, f"{path}.rows_per_update", "must be >= 1",
                 self.rows_per_update)
    checks.check(self.micro_batches >= 1 and self.rows_per_update % self.micro_batches == 0,
                 f"{path}.micro_batches", f"must be >= 1 and divide rows_per_update "
                 f"({self.rows_per_update})", self.micro_batches)
    checks.check(isinstance(self.ppo_epochs, int) and not isinstance(self.ppo_epochs, bool)
                 and self.ppo_epochs >= 1, f"{path}.ppo_epochs",
                 "must be an int >= 1 (optimizer steps per update)", self.ppo_epochs)
    checks.check(isinstance(self.update_chunk_rows, int) and not isinstance(
        self.update_chunk_rows, bool) and self.update_chunk_rows >= 0 and (
            self.update_chunk_rows == 0 or (self.rows_per_update % self.update_chunk_rows == 0
                                            and self.micro_batches == 1)),
                 f"{path}.update_chunk_rows", f"must be 0 (off) or an int >= 1 dividing "
                 f"rl.rows_per_update ({self.rows_per_update}), with rl.micro_batches=1 "
                 f"(got {self.micro_batches})", self.update_chunk_rows)
    checks.check(all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1
                     for f in self.loss_slot_fractions), f"{path}.loss_slot_fractions",
                 "must be () (off) or fractions of the row length in (0, 1]",
                 tuple(self.loss_slot_fractions))
    checks.check(all(isinstance(w, int) and not isinstance(w, bool) and 0 < w
                     for w in self.prefill_widths)
                 and list(self.prefill_widths) == sorted(set(self.prefill_widths))
                 and not set(self.prefill_widths) & set(self.buckets)
                 and all(w < max(self.buckets, default=0) for w in self.prefill_widths),
                 f"{path}.prefill_widths", "must be () (off) or strictly increasing ints > 0, "
                 f"each below the largest of rl.buckets ({tuple(self.buckets)}) and none of "
                 f"them", tuple(self.prefill_widths))
    checks.check(self.temperature > 0, f"{path}.temperature", "must be > 0", self.temperature)
    checks.check(self.top_k >= 0, f"{path}.top_k", "must be >= 0", self.top_k)
    checks.check(0.0 < self.top_p <= 1.0, f"{path}.top_p", "must be in (0, 1]", self.top_p)
    checks.check(len(self.buckets) > 0 and list(self.buckets) == sorted(set(self.buckets))
                 and self.buckets[0] >= 8, f"{path}.buckets",
                 "must be strictly increasing lengths >= 8", self.buckets)

  def transform(self, temperature: float | None = None, *,
                vocab_limit: int = 0) -> core_types.SamplingTransform:
    """The behaviour policy's sampling transform (`temperature` overrides `rl.temperature`).

    `vocab_limit`: ids at or past it are never sampled (the padded embedding rows of a model
    larger than its tokenizer: `models.sampling_rules.sampleable_vocab`); 0 = none.
    """
    return core_types.SamplingTransform(
        self.temperature if temperature is None else temperature, self.top_k, self.top_p,
        vocab_limit)
