"""The learner: train state, the optimizer, and jitted, donated update steps.

Modules: `state` (TrainState, optimizer, skipped-update guard), `shardings` (jit shardings on
a mesh), `steps` (the update and warm-start steps), `loss_slots` (an update that scores its loss
tokens' slots only: the host side).

`update_step(state, batch, ref_params)` is one Agentic GRPO policy update. Provisional and
correction rows are the same to it: each row carries its per-token advantage (staleness weight
folded in by `replay.StagedReplay.take`) and the behaviour log-probs its importance ratios are
taken against, and all rows go through `core.losses.policy_loss`. Optional terms: a KL penalty to
a frozen reference policy (`core.losses.kl_penalty`, `loss.kl_beta`) and an entropy bonus.

Which distribution each term sees: the importance ratio is taken under the sampling transform
(temperature, top-k, top-p), the distribution the behaviour log-probs were recorded under. The
KL term compares the temperature-scaled distributions of policy and reference without the top-k /
top-p filter: under the filter a token outside the reference's kept set has log-prob -1e30, and
its KL term is meaningless (the filter's kept sets differ, so the filtered distributions need not
share support). The entropy bonus (`loss.entropy_coef`: the loss subtracts `coef · H`, the
bonus of A3C, Mnih et al., 2016, and PPO, Schulman et al., 2017) and the logged `entropy` are the
sampling distribution's (filtered entries carry no mass and no gradient), at the distribution
each loss token was drawn from (the logits one position before it), aggregated like the policy
loss (`loss.aggregation`, row weights included).

`sft_step(state, batch)` is the supervised warm-start step (token cross-entropy on reference
episodes).

Both split the batch into `micro_batches` and accumulate gradients in a `lax.scan`. Each
micro-batch's loss is an `aggregate` of per-token values, so the batch loss is the sum of the
micro-batch losses weighted by `d_b / Σ d_b` with `d_b = core.losses.aggregate_denominator`:
micro-batching gives the same gradient as one pass over the whole batch (up to float rounding).

Optimizer: AdamW (Loshchilov & Hutter, 2019) with linear warm-up, global-norm clipping, inside
`optax.apply_if_finite`, which skips (and counts, in the optimizer state) an update whose
gradients are not finite. `check_skipped_updates` turns a run of consecutive skips into an error
(`rl.max_skipped_updates`), so that a run cannot go on training on nothing.

Mixed precision: parameters stored in bfloat16 (`model.param_dtype`) get a float32 master copy
(`TrainState.master`, sharded like the parameters, saved in checkpoints) and float32 AdamW
moments; the forward and backward passes run on the low-precision parameters, the float32
gradients update the master, and the parameters are the master cast back (`state` module). The
sampler and the KL reference use the low-precision parameters. Float32 parameters: no master.
A checkpoint written before the master existed restores with the master derived from its
parameters (`STATE_DERIVATIONS`, passed to `Checkpointer.restore`).
`restore_field` reads one field of a saved state (the policy's parameters, or the master) and
nothing else: the one path that evaluation of a checkpoint and export load a policy by.

Shardings are pluggable: `make_update_step` / `make_sft_step` take optional `in/out` shardings
(`learner_shardings` builds them on a device mesh, from `jax.eval_shape` of the train state); by
default everything is replicated on a one-device mesh.
"""

from agentic_grpo.learner.loss_slots import slot_width
from agentic_grpo.learner.loss_slots import slot_widths
from agentic_grpo.learner.loss_slots import with_loss_slots
from agentic_grpo.learner.shardings import learner_shardings
from agentic_grpo.learner.shardings import Shardings
from agentic_grpo.learner.shardings import TreeShardings
from agentic_grpo.learner.state import abstract_state
from agentic_grpo.learner.state import check_skipped_updates
from agentic_grpo.learner.state import from_master
from agentic_grpo.learner.state import init_state
from agentic_grpo.learner.state import make_optimizer
from agentic_grpo.learner.state import needs_master
from agentic_grpo.learner.state import nonfinite_count
from agentic_grpo.learner.state import restore_field
from agentic_grpo.learner.state import STATE_DERIVATIONS
from agentic_grpo.learner.state import NonFiniteUpdatesError
from agentic_grpo.learner.state import to_master
from agentic_grpo.learner.state import TrainState
from agentic_grpo.learner.steps import chunk_weights
from agentic_grpo.learner.steps import ChunkedUpdate
from agentic_grpo.learner.steps import CountedJit
from agentic_grpo.learner.steps import make_chunked_update
from agentic_grpo.learner.steps import make_sft_step
from agentic_grpo.learner.steps import real_chunks
from agentic_grpo.learner.steps import split_chunks
from agentic_grpo.learner.steps import make_update_step
