"""Writes colabs/agentic_grpo_walkthrough.ipynb (run it after editing the cells here)."""

import os

import nbformat as nbf
nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
nb.cells = [
md("""# Agentic GRPO, step by step

This notebook walks through one group of a coding agent's episodes on the embedded synthetic task:
stage rewards as each stage completes, provisional advantages, the final (hidden-test) reward, target
advantages in hindsight, and the correction `Δ = A* − Â`. It runs on CPU in well under a minute.

In Colab: `!pip install -q git+<this repository>` first; locally, run it from the repository's `.venv`."""),
code("""import numpy as np
import jax
import jax.numpy as jnp

from agentic_grpo import sandbox
from agentic_grpo.agent import references, workflow, workflow_config
from agentic_grpo.core import advantages, correction, losses
from agentic_grpo.tasks import synthetic"""),
md("""## A task and its reference episode

Tasks are small Python functions composed from list/int/string primitives. The prompt shows a
signature and public examples; hidden tests decide the final reward. The public examples often
under-determine the function: passing them is not passing the hidden tests."""),
code("""def witness_of(task):
  \"\"\"A program one edit from the reference that passes the public examples, not the hidden tests.\"\"\"
  program = synthetic.parse_program(task.metadata["program"])
  return synthetic.ambiguity_witness(program, [e.args[0] for e in task.public_examples],
                                     [e.args[0] for e in task.hidden_tests])

def hidden_pass_rate(program, task):
  return np.mean([program(e.args[0]) == e.expected for e in task.hidden_tests])

# An ambiguous task whose witness fails at least a third of the hidden tests.
task = next(t for t in synthetic.SyntheticTasks().tasks("validation", 0, 200)
            if synthetic.is_ambiguous(t) and hidden_pass_rate(witness_of(t), t) < 2 / 3)
print(task.prompt)
print("reference:", task.reference_solution)

pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits())
wf = workflow.Workflow(workflow_config.WorkflowConfig(), pool)
print(wf.stage_names)
reference = references.reference_outputs(wf, task)
for name, out in zip(wf.stage_names, reference):
  print(f"{name:>10}: {out!r}")"""),
md("""## One group of G = 4 episodes

Members 0 and 2 follow the reference; member 1 writes a program that passes the public examples
but not the hidden tests (an *ambiguity witness*); member 3 writes nothing parseable. Each stage is scored by running code in the sandbox as soon as the whole group has
completed it."""),
code("""witness = witness_of(task)
print("witness:", witness.expression())
G = 4
code_outputs = [reference[1], witness.expression() + "</code>", reference[1], "???</code>"]

def policy(stage_name, contexts):
  k = wf.stage_names.index(stage_name)
  if stage_name == "code":
    return code_outputs
  return [reference[k]] * 3 + ["</" + reference[k].split("</")[-1]]

episodes, results, final = wf.rollout([task] * G, policy)
stage_rewards = np.stack([r.rewards for r in results], axis=-1)[None]   # [B=1, G, S]
valid = np.stack([r.valid for r in results], axis=-1)[None]
final_rewards = np.asarray(final.rewards)[None]                          # [B=1, G]
print("stage rewards r[i, k]:\\n", stage_rewards[0])
print("final rewards R[i]:", final_rewards[0])"""),
md("""## Provisional advantages, targets in hindsight, corrections

`Â[i, k] = norm_group(r[:, k])[i]` is applied right after stage k. Once `R` is known, the
`outcome` target is `A*[i, k] = norm_group(R)[i]`; the correction update uses `Δ = A* − Â`,
importance-weighted against the behaviour policy. The provisional and correction updates sum to
the target's."""),
code("""provisional = advantages.provisional_advantages(stage_rewards, valid)
target = advantages.target_advantages(stage_rewards, final_rewards, mode="outcome", valid=valid)
delta = correction.correction_advantages(provisional, target)
np.set_printoptions(precision=2, suppress=True)
print("provisional Â:\\n", np.asarray(provisional[0]))
print("target A*:\\n", np.asarray(target[0]))
print("correction Δ:\\n", np.asarray(delta[0]))
reversed_sign = np.sign(provisional) * np.sign(target) < 0
print("segments whose provisional update the outcome reverses:", int(reversed_sign.sum()))
assert np.allclose(provisional + delta, target, atol=1e-6)
code_stage = wf.stage_names.index("code")
assert provisional[0, 1, code_stage] > 0 > target[0, 1, code_stage]"""),
md("""The witness (member 1) earns a positive provisional advantage for its code (it passes the public
examples, like the two reference members) but a negative target once the hidden tests run: the
correction reverses that update.

## The correction identity

At an unchanged policy (importance ratio 1) the clipped surrogate's gradient is linear in the
advantage, so `∇L(Â) + ∇L(A* − Â) = ∇L(A*)`. A softmax policy over a toy vocabulary shows it:"""),
code("""key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (3, 7))
x = jax.random.normal(jax.random.PRNGKey(1), (G, 5, 3))
tokens = jax.random.randint(jax.random.PRNGKey(2), (G, 5), 0, 7)
mask = jnp.ones((G, 5), bool)

def logprobs(w):
  return jnp.take_along_axis(jax.nn.log_softmax(x @ w), tokens[..., None], -1)[..., 0]

behaviour = logprobs(w)
grad = lambda adv: jax.grad(lambda w: losses.policy_loss(logprobs(w), behaviour, adv, mask)[0])(w)
a_hat, a_star = provisional[0, :, 1], target[0, :, 1]
print("max |∇L(Â) + ∇L(A*−Â) − ∇L(A*)| =",
      float(jnp.abs(grad(a_hat) + grad(a_star - a_hat) - grad(a_star)).max()))
pool.close()"""),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, os.path.join(os.path.dirname(os.path.abspath(__file__)), "agentic_grpo_walkthrough.ipynb"))
