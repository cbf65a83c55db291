"""One decode step of a Llama-family decoder on CUDA, captured once per ``generate`` call as a CUDA graph and
replayed for every token: ``LeanDecode``'s fast path on GPUs.

Knows what ``fused`` knows (the layer layout of Llama, Qwen2, Qwen3 and Mistral); nothing about sampling. At the
batch sizes of RL rollouts a GPU decode step is bound by kernel launches, not by memory bandwidth: the model's own
forward launches some fifteen kernels a layer from Python for every token (a 0.5B model's weights take ~0.3 ms to
read on an H100; its 24 layers' launches take longer). The step here computes what ``FusedDecodeStep`` computes,
but its shapes never change: keys and values live in buffers of every column, attention reads all of them under a
mask, and the step writes its column at an index held on the device. So the whole step (embedding, every layer, the
final norm and the LM head) is one graph launch; the host only copies in the ids, positions and column. Rows that
have ended stay in the batch (their tokens are discarded): a captured graph cannot narrow.

On CPU (the tests) the same step runs eagerly, uncaptured: the values are checked there against the model's forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lightning_grpo.engines.decode.fused import FusedDecodeStep, llama_like

WARMUP_RUNS = 2  # eager runs on a side stream before capture, as torch.cuda.graphs asks (allocator, cuBLAS handles)


def graphable(model: nn.Module) -> bool:
    """A Llama-family model (``fused.llama_like``) whose layers are plain ``nn.Linear`` with ordinary CUDA tensors of
    one floating dtype: no adapters (LoRA layers run the model's forward), no shards."""
    if not llama_like(model):
        return False
    linears = [m for m in model.get_decoder().layers.modules() if isinstance(m, nn.Linear)]
    return (
        all(type(m) is nn.Linear and type(m.weight) in (Tensor, nn.Parameter) and m.weight.is_cuda for m in linears)
        and len({m.weight.dtype for m in linears}) == 1
    )


class GraphedDecodeStep(FusedDecodeStep):
    """``(input_ids [N, 1], attention_mask [N, L], position_ids [N, 1], cache) -> [N, V]`` fp32 next-token logits,
    as ``FusedDecodeStep`` gives them, from a step of static shapes: captured as a CUDA graph at the first call after
    ``bind`` and replayed after (on CPU, run eagerly). Calls after the first must be the following decode steps of
    the same rows (``attention_mask`` one column wider each time): its last column is the one written.

    The returned logits are the graph's output buffer: read them before the next call.
    """

    narrows = False  # the decode batch keeps every row: a captured graph's shapes are fixed

    def bind(self, cache: DynamicCache, length: int) -> GraphedDecodeStep:
        super().bind(cache, length)
        rows, device = self.keys[0].shape[0], self.keys[0].device
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)  # [N, 1] this step's input ids
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)  # [N, 1]
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # [1] the KV column this step writes
        self.mask = torch.zeros(rows, 1, 1, length, dtype=torch.bool, device=device)  # [N, 1, 1, L] attended
        self.mask[:, 0, 0, : cache.get_seq_length()] = True  # the prefill's columns; padding set at the first call
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None
        return self

    def select(self, rows: Tensor, width: int) -> None:
        raise NotImplementedError("GraphedDecodeStep keeps every row (narrows = False)")

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: object) -> Tensor:
        width = attention_mask.shape[1]  # this step's column is the last one
        first = self.logits is None
        if first:  # the prompt's padding, once: later columns are the decoded tokens, all attended
            self.mask[:, 0, 0, : width - 1] = attention_mask[:, : width - 1].bool()
        self.ids.copy_(input_ids)
        self.positions.copy_(position_ids)
        self.column.fill_(width - 1)
        if not self.ids.is_cuda:
            self.logits = self._step()
        elif first:
            self.logits = self._capture()
            self.graph.replay()
        else:
            self.graph.replay()
        return self.logits

    def _step(self) -> Tensor:
        """One decode step on the static buffers: [N, V] fp32 logits."""
        self.mask.index_fill_(3, self.column, True)
        return self.step(self.ids, self.positions, self.mask, column=self.column)

    def _capture(self) -> Tensor:
        """Capture ``_step`` as a CUDA graph; the step is idempotent (it writes the same column from the same
        inputs), so the warm-up runs change nothing the replay does not redo. Returns the graph's output buffer."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            logits = self._step()
        return logits
