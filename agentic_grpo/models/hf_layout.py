"""How our parameters lie in Hugging Face Llama / Qwen2 / Qwen3 tensors: names, shapes, layouts.

`tensor_specs(config)` maps each parameter path to its tensor (`TensorSpec`: name, shape there,
layout kind); `param_shape` is the parameter's shape from it; `read_slice` reads one block of a
parameter (our layout) from a lazy safetensors slice, touching only the rows, columns and heads
the block needs. `hf_import` reads checkpoints with them, `hf_export` writes the inverse.

| Hugging Face tensor (`model.` prefix) | shape | parameter | shape |
|---|---|---|---|
| `embed_tokens.weight` | `[V, D]` | `embed` | `[V, D]` |
| `lm_head.weight` (untied only) | `[V, D]` | `lm_head` | `[D, V]` |
| `layers.i.self_attn.{q,k,v}_proj.weight` | `[H·Dh, D]` | `layers.i.attn.{q,k,v}` | `[D, H, Dh]` |
| `layers.i.self_attn.{q,k,v}_proj.bias` (Qwen2) | `[H·Dh]` | `layers.i.attn.{q,k,v}_bias` | `[H, Dh]` |
| `layers.i.self_attn.{q,k}_norm.weight` (Qwen3) | `[Dh]` | `layers.i.attn.{q,k}_norm.scale` | `[Dh]` |
| `layers.i.self_attn.o_proj.weight` | `[D, H·Dh]` | `layers.i.attn.o` | `[H, Dh, D]` |
| `layers.i.mlp.{gate,up}_proj.weight` | `[F, D]` | `layers.i.mlp.{gate,up}` | `[D, F]` |
| `layers.i.mlp.down_proj.weight` | `[D, F]` | `layers.i.mlp.down` | `[F, D]` |
| `layers.i.{input,post_attention}_layernorm.weight` | `[D]` | `layers.i.{attn,mlp}_norm.scale` | `[D]` |
| `norm.weight` | `[D]` | `final_norm.scale` | `[D]` |

Rotary embeddings use the same "rotate half" layout as Hugging Face, so q/k
need no permutation. `hf_export` writes the same table the other way.
"""

import dataclasses

import numpy as np

from agentic_grpo.models import transformer

# How a parameter is laid out relative to its Hugging Face tensor:
# same: identical; t: transposed (2-D); in_heads: [H·Dh, D] -> [D, H, Dh];
# out_heads: [D, H·Dh] -> [H, Dh, D]; bias_heads: [H·Dh] -> [H, Dh].
KINDS = ("same", "t", "in_heads", "out_heads", "bias_heads")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """One parameter's Hugging Face tensor.

  Attributes:
    name: tensor name in the safetensors files.
    hf_shape: its shape there.
    kind: one of `same`, `t`, `in_heads`, `out_heads`, `bias_heads`.
  """
  name: str
  hf_shape: tuple[int, ...]
  kind: str


def tensor_specs(c: transformer.ModelConfig, prefix: str = "model.") -> dict[tuple, TensorSpec]:
  """Parameter path (as in `nnx.to_pure_dict`) -> its Hugging Face tensor, for `c`."""
  d, h, kv, dh, f, v = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size
  specs = {("embed",): TensorSpec(f"{prefix}embed_tokens.weight", (v, d), "same"),
           ("final_norm", "scale"): TensorSpec(f"{prefix}norm.weight", (d,), "same")}
  if not c.tie_embeddings:
    specs[("lm_head",)] = TensorSpec("lm_head.weight", (v, d), "t")
  for i in range(c.n_layers):
    p, a = f"{prefix}layers.{i}.", ("layers", i, "attn")
    for name, heads in (("q", h), ("k", kv), ("v", kv)):
      specs[a + (name,)] = TensorSpec(f"{p}self_attn.{name}_proj.weight", (heads * dh, d),
                                      "in_heads")
      if c.qkv_bias:
        specs[a + (f"{name}_bias",)] = TensorSpec(f"{p}self_attn.{name}_proj.bias",
                                                  (heads * dh,), "bias_heads")
    if c.qk_norm:
      for name in ("q", "k"):
        specs[a + (f"{name}_norm", "scale")] = TensorSpec(f"{p}self_attn.{name}_norm.weight",
                                                          (dh,), "same")
    specs[a + ("o",)] = TensorSpec(f"{p}self_attn.o_proj.weight", (d, h * dh), "out_heads")
    m = ("layers", i, "mlp")
    specs[m + ("gate",)] = TensorSpec(f"{p}mlp.gate_proj.weight", (f, d), "t")
    specs[m + ("up",)] = TensorSpec(f"{p}mlp.up_proj.weight", (f, d), "t")
    specs[m + ("down",)] = TensorSpec(f"{p}mlp.down_proj.weight", (d, f), "t")
    specs[("layers", i, "attn_norm", "scale")] = TensorSpec(f"{p}input_layernorm.weight", (d,),
                                                            "same")
    specs[("layers", i, "mlp_norm", "scale")] = TensorSpec(
        f"{p}post_attention_layernorm.weight", (d,), "same")
  return specs


def bounds(index: tuple, shape: tuple[int, ...]) -> list[tuple[int, int]]:
  """Concrete `(start, stop)` per axis of a `make_array_from_callback` index."""
  out = []
  for sl, n in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)), shape):
    start, stop, step = sl.indices(n)
    if step != 1:
      raise ValueError(f"strided shard index {sl} is not supported")
    out.append((start, stop))
  return out


def read_slice(tensor, kind: str, head_dim: int, index: tuple,
               shape: tuple[int, ...]) -> np.ndarray:
  """The `index` block of a parameter (our layout) from a lazy safetensors slice.

  Args:
    tensor: `safe_open(...).get_slice(name)` (or anything sliceable like it).
    kind: the layout relation (`TensorSpec.kind`).
    head_dim: `Dh`, to split `H·Dh` rows into whole heads.
    index: tuple of slices into the parameter of shape `shape`.
    shape: the parameter's (our layout) shape.

  Returns:
    The block as a NumPy array in the tensor's stored dtype. Only the heads,
    rows and columns the block needs are read (for the head kinds: whole
    heads, then the `head_dim` sub-range).
  """
  b = bounds(index, shape)
  s = lambda i: slice(*b[i])  # pylint: disable=unnecessary-lambda-assignment
  if kind == "same":
    return tensor[tuple(s(i) for i in range(len(shape)))]
  if kind == "t":
    return tensor[s(1), s(0)].T
  (h0, h1), (k0, k1) = (b[1], b[2]) if kind == "in_heads" else (b[0], b[1])
  rows = slice(h0 * head_dim, h1 * head_dim)
  if kind == "in_heads":  # [H·Dh, D] rows of heads h0..h1 -> [D, H, Dh]
    x = tensor[rows, s(0)]
    return x.reshape(h1 - h0, head_dim, -1)[:, k0:k1].transpose(2, 0, 1)
  if kind == "out_heads":  # [D, H·Dh] columns of heads h0..h1 -> [H, Dh, D]
    x = tensor[s(2), rows]
    return x.reshape(-1, h1 - h0, head_dim)[:, :, k0:k1].transpose(1, 2, 0)
  if kind == "bias_heads":
    return tensor[rows].reshape(h1 - h0, head_dim)[:, k0:k1]
  raise ValueError(f"unknown tensor kind {kind!r}; known: {KINDS}")


def param_shape(spec: TensorSpec, head_dim: int) -> tuple[int, ...]:
  """The parameter's shape (our layout) from its tensor's `hf_shape` and `kind`."""
  hs = spec.hf_shape
  if spec.kind == "same":
    return hs
  if spec.kind == "t":
    return hs[::-1]
  if spec.kind == "in_heads":
    return (hs[1], hs[0] // head_dim, head_dim)
  if spec.kind == "out_heads":
    return (hs[1] // head_dim, head_dim, hs[0])
  return (hs[0] // head_dim, head_dim)
