"""One decode step of a Llama-family decoder with fewer, larger operations: ``LeanDecode``'s fast path on CPU.

Knows the layer layout of Llama, Qwen2, Qwen3 and Mistral (pre-norm RMSNorm, rotary attention, a SiLU-gated
MLP); nothing about sampling. At one token per row, the model's own ``forward`` runs many small operations a
layer (each norm as five, three projections for q, k and v, two for gate and up, a cache grown by concatenation,
a mask built every step). Here: ``F.rms_norm`` as one; q, k and v as one product and gate and up as another,
against weights concatenated (and pre-packed for oneDNN) once per ``generate`` call; keys and values written into
preallocated buffers. On the benchmark's gen model that is 9.03 -> 8.00 ms a step (``--decode-step``). The values
are the model's to fp32 rounding (tested against its forward), using its own embedding, rotary embedding (any
RoPE scaling), final norm and LM head.

Anything else (another architecture, a sliding window, LoRA-wrapped layers, sharded or non-fp32 weights, GPU)
is not ``fusable`` and runs the model's forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lightning_grpo.engines.decode.packing import can_pack, linear

FUSED_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def _layers(model: nn.Module) -> list[nn.Module]:
    return list(getattr(model.get_decoder(), "layers", []))


def llama_like(model: nn.Module) -> bool:
    """A Llama, Qwen2, Qwen3 or Mistral model (not wrapped: a PEFT model is not) with SiLU gating and no sliding
    window: the layer layout ``FusedLayer`` computes."""
    config = getattr(model, "config", None)
    layers = _layers(model) if hasattr(model, "get_decoder") else []
    if getattr(config, "model_type", None) not in FUSED_TYPES or not layers or config.hidden_act != "silu":
        return False
    if getattr(config, "sliding_window", None) is not None and config.model_type == "mistral":
        return False
    return all(getattr(layer.self_attn, "sliding_window", None) is None for layer in layers)


def fusable(model: nn.Module) -> bool:
    """A ``llama_like`` model whose layers are plain fp32 CPU ``nn.Linear`` (no adapters, no shards)."""
    return llama_like(model) and all(
        can_pack(layer.get_submodule(name))
        for layer in _layers(model)
        for name in (*PROJECTIONS, "self_attn.o_proj", "mlp.down_proj")
    )


def fused_projections(model: nn.Module) -> Iterator[nn.Module]:
    """The layers whose weights a ``FusedDecodeStep`` holds concatenated (so they need no packed copy of their own)."""
    for layer in _layers(model):
        yield from (layer.get_submodule(name) for name in PROJECTIONS)


def _rms_norm(x: Tensor, norm: nn.Module) -> Tensor:
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding as ``apply_rotary_pos_emb``: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _joined(layers: list[nn.Linear], rows: int) -> Callable[[Tensor], Tensor]:
    """One linear map computing every layer's output, concatenated: their weights (and biases) stacked."""
    weight = torch.cat([layer.weight.detach() for layer in layers])  # [sum of outputs, in]
    if all(layer.bias is None for layer in layers):
        return linear(weight, None, rows)
    bias = torch.cat([layer.bias.detach() if layer.bias is not None else weight.new_zeros(layer.out_features)
                      for layer in layers])  # fmt: skip
    return linear(weight, bias, rows)


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> Tensor:
    """One query position's attention with grouped KV heads, without repeating the keys and values per query head
    (the math fallback of ``scaled_dot_product_attention`` with ``enable_gqa`` copies them, 7x the cache for
    Qwen2.5-0.5B): each group's queries as one matrix product. Query head h reads KV head h // (heads / kv heads),
    as Hugging Face's ``repeat_kv``. Softmax in fp32, as the models' eager attention.

    Args:
        q: [N, heads, 1, D].
        keys, values: [N, kv heads, L, D].
        mask: [N, 1, 1, L] True where attended.
    Returns: [N, heads, 1, D].
    """
    n, heads, _, d = q.shape
    grouped = q.reshape(n, keys.shape[1], heads // keys.shape[1], d)  # [N, kv heads, g, D]
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * scale  # [N, kv heads, g, L]
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(n, heads, 1, d)


class FusedLayer:
    """One decoder layer's decode step over [N, 1, H] hidden states."""

    def __init__(self, layer: nn.Module, rows: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norms = (layer.input_layernorm, layer.post_attention_layernorm)
        self.qk_norms = (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else None  # Qwen3
        self.qkv = _joined([attn.q_proj, attn.k_proj, attn.v_proj], rows)
        self.splits = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.gate_up = _joined([mlp.gate_proj, mlp.up_proj], rows)
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj  # packed by ``packed_linears`` while decoding
        self.head_dim, self.scaling = attn.head_dim, attn.scaling

    def __call__(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor,
        column: Tensor | None = None,
    ) -> Tensor:
        """x [N, 1, H]; cos/sin [N, 1, 1, D]; keys/values [N, kv heads, L, D], this step's column written here: the
        last one, or ``column`` ([1] on the device: a captured graph's step, which attends to all L columns);
        mask [N, 1, 1, L] True where attended."""
        n, d = x.shape[0], self.head_dim
        h = _rms_norm(x, self.norms[0])
        q, k, v = self.qkv(h).split(self.splits, dim=-1)  # [N, 1, *]
        q, k, v = (t.view(n, 1, -1, d) for t in (q, k, v))  # [N, 1, heads, D]
        if self.qk_norms is not None:
            q, k = _rms_norm(q, self.qk_norms[0]), _rms_norm(k, self.qk_norms[1])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [N, heads, 1, D]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if column is None:
            keys[:, :, -1:], values[:, :, -1:] = k, v
            attn = nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=True
            )  # [N, heads, 1, D]
        else:
            keys.index_copy_(2, column, k)
            values.index_copy_(2, column, v)
            attn = grouped_attention(q, keys, values, mask, self.scaling)  # [N, heads, 1, D]
        x = x + self.o_proj(attn.transpose(1, 2).reshape(n, 1, -1))
        gate, up = self.gate_up(_rms_norm(x, self.norms[1])).chunk(2, dim=-1)
        return x + self.down_proj(nn.functional.silu(gate) * up)


class FusedDecodeStep:
    """``(input_ids [N, 1], attention_mask [N, L], position_ids [N, 1], cache) -> [N, V]`` fp32 next-token logits,
    as ``NextTokenLogits`` gives them, for the decode steps after a prefill: ``bind`` moves the prefill's cache into
    buffers that hold ``length`` columns, and every call writes its column there (the ``cache`` argument is then
    not read). ``select`` narrows the buffers to the rows still decoding.

    Args:
        model: a ``fusable`` model; the weights are read now (call it per ``generate``, after the last update).
        rows: the rows decoded together (oneDNN packs for that many).
    """

    narrows = True  # ``select`` keeps some rows: the decode loop may drop ended ones

    def __init__(self, model: nn.Module, rows: int) -> None:
        decoder = model.get_decoder()
        self.embed, self.norm, self.rotary = decoder.embed_tokens, decoder.norm, decoder.rotary_emb
        self.head = model.get_output_embeddings()
        self.layers = [FusedLayer(layer, rows) for layer in decoder.layers]
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []

    def bind(self, cache: DynamicCache, length: int) -> FusedDecodeStep:
        """Buffers of ``length`` columns per layer, the first ones the prefill's keys and values."""
        self.keys, self.values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # [N, kv heads, P, D]
            self.keys.append(k.new_zeros(*k.shape[:2], length, k.shape[3]))  # zeros: a masked column is read as 0
            self.values.append(v.new_zeros(*v.shape[:2], length, v.shape[3]))
            self.keys[-1][:, :, : k.shape[2]] = k
            self.values[-1][:, :, : v.shape[2]] = v
        return self

    def select(self, rows: Tensor, width: int) -> None:
        """Keep the buffers' ``rows`` ([n] indices into the current rows), in that order: new buffers of n rows with
        the first ``width`` columns (those written so far) copied, so a copy costs what has been decoded, not the
        whole length."""
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):  # [N, kv heads, L, D]
                buffers[i] = old.new_empty(len(rows), *old.shape[1:])  # [n, kv heads, L, D]
                buffers[i][:, :, :width] = old[rows, :, :width]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: object) -> Tensor:
        mask = attention_mask[:, None, None, :].bool()  # [N, 1, 1, L]: this step's column is the last one
        return self.step(input_ids, position_ids, mask, width=attention_mask.shape[1])

    def step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        mask: Tensor,
        width: int | None = None,
        column: Tensor | None = None,
    ) -> Tensor:
        """[N, V] fp32 logits of one decode step of [N, 1] ids: the layers read the buffers' first ``width`` columns
        and write the last of them, or (``column``, [1] on the device) read every column and write that one."""
        x = self.embed(input_ids)  # [N, 1, H]
        cos, sin = (t.unsqueeze(1) for t in self.rotary(x, position_ids))  # [N, 1, 1, D]
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            x = layer(x, cos, sin, keys[:, :, :width], values[:, :, :width], mask, column)
        return self.head(self.norm(x)[:, -1]).float()  # [N, V]
