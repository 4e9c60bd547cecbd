"""Parallel layouts (TP, PP, EP, attention-DP): what is valid for a model on a host, and the search space.

A layout may use fewer GPUs than the host when its GPU count divides the host's: the host then runs
`host / layout` identical replicas behind a router (each serves an equal share of the requests).

Conventions (as SGLang/TensorRT-LLM use them): attention and dense layers are split `tp` ways inside
each of `dp` attention-data-parallel groups; routed experts are split over all `tp × dp` GPUs of a
stage, `ep` ways by expert and `moe_tp = tp × dp / ep` ways inside each expert; `pp` stages in series.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.errors import ConfigError
from servelab.model.architecture import Architecture


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1  # attention data parallel

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_tp(self) -> int:
        return max(1, self.tp * self.dp // self.ep)

    @property
    def label(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        return "+".join(parts)


def check_layout(arch: Architecture, layout: Layout, num_gpus: int) -> str | None:
    """Why a layout cannot run this model on this host (None when it can)."""
    if min(layout.tp, layout.pp, layout.ep, layout.dp) < 1:
        return "tp, pp, ep and dp must all be at least 1"
    if layout.num_gpus > num_gpus or num_gpus % layout.num_gpus:
        return (
            f"tp×dp×pp = {layout.tp}×{layout.dp}×{layout.pp} = {layout.num_gpus} GPUs, which does not divide "
            f"the host's {num_gpus} (a smaller layout runs as {num_gpus}/n identical replicas)"
        )
    if arch.num_heads % layout.tp:
        return f"{arch.num_heads} attention heads do not split over tp={layout.tp}"
    if layout.pp > arch.num_layers:
        return f"pp={layout.pp} is more than the {arch.num_layers} layers"
    if layout.ep > 1:
        if not arch.is_moe:
            return f"ep={layout.ep} needs an MoE model; {arch.name} is dense"
        if (layout.tp * layout.dp) % layout.ep:
            return f"ep={layout.ep} does not divide the tp×dp = {layout.tp * layout.dp} GPUs of a stage"
        if arch.num_experts % layout.ep:
            return f"{arch.num_experts} experts do not split over ep={layout.ep}"
    if layout.dp > 1 and not arch.is_moe:
        return "attention-DP is for MoE models; for a dense model run independent replicas"
    return None


def validate(arch: Architecture, layout: Layout, num_gpus: int) -> None:
    reason = check_layout(arch, layout, num_gpus)
    if reason:
        raise ConfigError(f"layout {layout.label} is not valid: {reason}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def replicas(layout: Layout, num_gpus: int) -> int:
    """How many copies of `layout` the host runs side by side (data parallel behind one router)."""
    return max(1, num_gpus // layout.num_gpus)


def candidate_layouts(arch: Architecture, num_gpus: int, with_replicas: bool = False) -> list[Layout]:
    """Every valid layout using all GPUs (divisors of the GPU count); with `with_replicas`, also the
    smaller layouts the host runs as several data-parallel replicas (TP4 ×2 on 8 GPUs)."""
    sizes = _divisors(num_gpus) if with_replicas else [num_gpus]
    out: list[Layout] = []
    for size in sorted(sizes, reverse=True):
        out.extend(_layouts_of(arch, size, num_gpus))
    return out


def _layouts_of(arch: Architecture, size: int, num_gpus: int) -> list[Layout]:
    out: list[Layout] = []
    for pp in _divisors(size):
        stage = size // pp
        for dp in _divisors(stage):
            tp = stage // dp
            eps = [e for e in _divisors(stage)] if arch.is_moe else [1]
            for ep in eps:
                layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp)
                if check_layout(arch, layout, num_gpus) is None:
                    out.append(layout)
    return out
