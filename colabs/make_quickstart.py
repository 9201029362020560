"""Writes colabs/quickstart.ipynb (run it after editing the cells here)."""

import os

import nbformat as nbf

nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
nb.cells = [
md("""# Agentic GRPO quickstart

Trains the tiny embedded default (a ~1M-parameter byte-level model on synthetic coding tasks) for a
few minutes on whatever the runtime has (CPU, GPU or TPU), plots its learning curves, and walks one
group of episodes of the long-horizon task (`tasks/long_horizon.py`): each stage's text, stage
reward and provisional advantage, then the final reward, the target advantage and the correction.

Set `AGENTIC_GRPO_NOTEBOOK_SMOKE=1` for a micro model and budgets (how CI runs this notebook)."""),
code("""# Installs the package from the repository (in Colab: set REPO to the repository's git URL,
# e.g. "https://github.com/OWNER/REPO"). Run from a checkout's colabs/ folder, it uses the checkout.
import os
import subprocess
import sys

REPO = ""  # @param {type:"string"}
root = os.path.abspath("..")
if not os.path.isdir(os.path.join(root, "experiments")):  # not in a checkout: clone and install
  root = os.path.abspath("agentic_grpo_repo")
  if not os.path.isdir(root):
    if not REPO:
      raise RuntimeError("set REPO to the repository's git URL")
    subprocess.check_call(["git", "clone", "-q", "--depth=1", REPO, root])
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", root])
sys.path.insert(0, root)  # the experiments/ configs live beside the package"""),
code("""import json
import os
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import train
from experiments import tiny_codegen

SMOKE = os.environ.get("AGENTIC_GRPO_NOTEBOOK_SMOKE") == "1"
print("devices:", jax.devices())"""),
md("""## Train the tiny default

A supervised warm-start on reference episodes, then Agentic GRPO (stage rewards with immediate
provisional updates, retroactive corrections when the hidden-test reward arrives). The full default
(`make train`) runs 300 warm-start steps and 180 RL updates; this run is shorter."""),
code("""c = tiny_codegen.get_config()
c.log.progress_bar = False
c.log.tensorboard = False
if SMOKE:
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  c.warmstart.update(steps=2, batch_size=4)
  c.rl.update(num_steps=2, tasks_per_batch=2, group_size=2, rows_per_update=4)
  c.workflow.max_new_tokens = 12
  c.loss.max_tokens = 12
  c.task.eval_size = 4
  c.eval.update(every=1, num_samples=0)
  c.replay.skip_zero_advantage = False
  c.checkpoint.every = 0
else:
  c.warmstart.steps = 200
  c.rl.num_steps = 30
  c.task.eval_size = 256
  c.eval.update(every=10, num_samples=0)
workdir = tempfile.mkdtemp(prefix="agentic_grpo_")
out = train.run(config_lib.from_config_dict(c), workdir)
print(f"warm-start pass@1 {out['warmstart_pass_at_1']:.3f} -> after RL {out['final_pass_at_1']:.3f}")"""),
md("""## Learning curves

Held-out greedy pass@1 (every hidden test passed) against the global step, and the training
rewards of each stage and of the episode, from the run's `metrics.jsonl`."""),
code("""rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl")) if l.strip()]
ev = [r for r in rows if "eval/pass_at_1" in r]
rl = [r for r in rows if r.get("phase") == "rl"]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.5))
a1.errorbar([r["step"] for r in ev], [r["eval/pass_at_1"] for r in ev],
            yerr=[r["eval/pass_at_1_stderr"] for r in ev], fmt="o-", capsize=3)
a1.set(xlabel="step", ylabel="held-out pass@1", title="evaluation")
for key in sorted({k for r in rl for k in r if k.startswith("reward/")}):
  pts = [(r["step"], r[key]) for r in rl if key in r]
  a2.plot(*zip(*pts), label=key.split("/", 1)[1])
a2.set(xlabel="step", title="training rewards")
a2.legend(fontsize=8)
plt.show()"""),
md("""## One group on the long-horizon task

A long-horizon task is a pipeline of K = 4 pieces `f(x) = g4(g3(g2(g1(x))))`. Each stage writes one
piece from the piece's own public examples and is checked at once by running it on them; the final
reward runs the composed program on hidden tests, all or nothing. A piece's examples can fail to
single it out: a wrong piece that passes them earns its stage reward and sinks the final reward.

Four attempts of the same task: member 0 writes the reference; member 1 writes an *ambiguous*
wrong piece (it passes its examples); member 2 writes a piece that fails its examples; member 3
writes nothing parseable at stage 2."""),
code("""from agentic_grpo import sandbox
from agentic_grpo.agent import references, workflow, workflow_config
from agentic_grpo.core import advantages, correction
from agentic_grpo.tasks import long_horizon, synthetic

source = long_horizon.LongHorizonTasks()
task, k_amb, rival = next((t, k, q) for t in source.tasks("validation", 0, 200)
                          for k in range(4) for q in [long_horizon.piece_ambiguity(t, k)] if q)
print(task.prompt)
print(task.reference_solution)
pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits())
wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("pieces",), num_pieces=4,
                                                     reward_mode="all_pass"), pool)
ref = references.reference_outputs(wf, task)
ambiguous = synthetic.Program(rival.in_type, (rival,)).expression("x") + "</code>"
k_bad = (k_amb + 1) % 4
program = synthetic.parse_program(task.metadata["program"])

def breaks_f(q, k):  # whether piece `k` replaced by `q` changes `f` on a hidden test
  prims = program.prims[:k] + (q,) + program.prims[k + 1:]
  return any(synthetic.Program(program.in_type, prims)(e.args[0]) != e.expected
             for e in task.hidden_tests)

piece = long_horizon.pieces(task)[k_bad]
bad_piece = next(q for q in synthetic.PRIMITIVES
                 if (q.in_type, q.out_type) == (piece.primitive.in_type, piece.primitive.out_type)
                 and any(q.fn(e.args[0]) != e.expected for e in piece.examples)
                 and breaks_f(q, k_bad))
wrong = synthetic.Program(bad_piece.in_type, (bad_piece,)).expression("x") + "</code>"

def output(member, k):
  if member == 1 and k == k_amb:
    return ambiguous
  if member == 2 and k == k_bad:
    return wrong
  if member == 3 and k == 1:
    return "((</code>"
  return ref[k]

G = 4
episodes, results, final = wf.rollout(
    [task] * G, lambda name, ctxs: [output(i, int(name[1:]) - 1) for i in range(G)])
pool.close()
print(f"piece g{k_amb + 1}: member 1 writes {ambiguous[:-7]!r} (ambiguous); "
      f"piece g{k_bad + 1}: member 2 writes {wrong[:-7]!r}")"""),
code("""stage_rewards = np.stack([r.rewards for r in results], axis=-1)[None]   # [1, G, K]
valid = np.stack([r.valid for r in results], axis=-1)[None]
final_rewards = final.rewards[None]                                     # [1, G]
provisional = np.asarray(advantages.provisional_advantages(stage_rewards, valid))
target = np.asarray(advantages.target_advantages(stage_rewards, final_rewards, mode="outcome",
                                                 valid=valid))
delta = np.asarray(correction.correction_advantages(provisional, target))
for i in range(G):
  print(f"=== member {i}: final reward {final_rewards[0, i]:.0f}")
  for k, seg in enumerate(episodes[i].segments):
    shown = seg.opening.replace(task.prompt, "").strip().replace("\\n", " | ")
    print(f"  {shown} {seg.output}")
    print(f"      stage reward {stage_rewards[0, i, k]:.0f}  provisional Â {provisional[0, i, k]:+.2f}"
          f"  target A* {target[0, i, k]:+.2f}  correction Δ {delta[0, i, k]:+.2f}")"""),
md("""Member 1's pieces all pass their checks, so every stage was credited at once (positive Â); the
hidden tests fail, and the correction `Δ = A* − Â` takes that credit back. That is the situation
retroactive correction is for; `experiments/ablation.py` measures whether it pays on this task."""),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.ipynb")
nbf.write(nb, path)
print("wrote", path)
