"""From a primitive's attributes to the structure of its output pipeline (``jit.output``).

Matmul, inner product, convolution and depthwise convolution map their attributes the
same way; this is the one place that does it.

Example::

    >>> from primitives.attr import Attr, PostOps
    >>> from primitives.memory import desc
    >>> attr = Attr(scales={"src": 0, "weights": 2}).set_post_ops(PostOps().eltwise("relu"))
    >>> p = output_plan(attr, desc((4, 8), "u8", "ab"), None, lambda src1, i: "col")
    >>> p.spec.scale, p.spec.dst_dt, [type(op).__name__ for op in p.spec.post_ops]
    ('col', 'u8', ['EltwiseOp'])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from jit.output import BinaryOp, EltwiseOp, OutputSpec, SumOp, assume_dst_params_nonneg, for_dst_params
from primitives.attr import DST, SRC, WEIGHTS, Attr, Eltwise, Sum
from primitives.memory import MemoryDesc
from primitives.reference import dst_scale_inverse


@dataclass(frozen=True)
class OutputPlan:
    spec: OutputSpec
    scale_kind: str  # "none" | "common" | "col": src scale x weights scale(s)
    binary: tuple  # (post-op index, broadcast) of each binary post-op


def output_plan(attr: Attr, dst_md: MemoryDesc, bias_md: MemoryDesc | None,
                broadcast: Callable[[MemoryDesc, int], str], *, extra_scale: bool = False,
                col_comp: bool = True) -> OutputPlan:
    """The output stage for ``attr``; ``broadcast(src1_desc, index)`` names a binary operand's
    broadcast ("common", "col", "row", "full") or raises naming ``post_ops[index]``.
    ``extra_scale``: a scale is applied even without scale attributes (halve_weights' 2).
    ``col_comp``: whether the column compensation can be nonzero (s8 source, or a source
    zero point); without it the stage spends no instruction on it."""
    post, binary = [], []
    for i, e in enumerate(attr.post_ops):
        if isinstance(e, Eltwise):
            post.append(EltwiseOp(e.alg, e.alpha, e.beta))
        elif isinstance(e, Sum):
            post.append(SumOp(e.dt or dst_md.dt))
        else:
            kind = broadcast(e.src1, i)
            post.append(BinaryOp(e.alg, kind))
            binary.append((i, kind))
    has_scale = SRC in attr.scales or WEIGHTS in attr.scales or extra_scale
    scale_kind = ("col" if attr.scales_mask(WEIGHTS) else "common") if has_scale else "none"
    zp_dst = attr.zero_points_mask(DST)
    spec = OutputSpec(col_comp=col_comp, float_mode=True, scale=scale_kind, bias="none" if bias_md is None else "col",
                      post_ops=tuple(post), dst_scale=DST in attr.scales,
                      dst_zp="none" if zp_dst is None else ("col" if zp_dst else "common"), dst_dt=dst_md.dt)
    spec = assume_dst_params_nonneg(spec)  # (the primitives check the values: dst_stage)
    if dst_md.dt == "s32" and scale_kind == "none" and not post and bias_md is None and zp_dst is None \
            and DST not in attr.scales:
        spec = OutputSpec(col_comp=col_comp)  # the plain int32 sums: no float stage, wrapping as the GEMM's integer mode
    return OutputPlan(spec, scale_kind, tuple(binary))


def column_compensation(attr: Attr, src_dt: str) -> bool:
    """Whether a GEMM kernel's column compensation can be nonzero: it carries an s8
    source's +128 shift and the source zero point (``output_plan``'s ``col_comp``)."""
    return src_dt == "s8" or SRC in attr.zero_points


def dst_stage(spec: OutputSpec, dst_scale, dst_zp) -> tuple[float, OutputSpec]:
    """One call's dst scale factor (f32(1) / scale; 1.0 without a dst scale) and the
    output stage to run with it and the dst zero points (arrays, or None where absent):
    ``spec``, or its variant with the lower clamp where the values break what ``spec``
    assumes (``jit.output.for_dst_params``)."""
    inverse = dst_scale_inverse(dst_scale[0]) if dst_scale is not None else 1.0
    return inverse, for_dst_params(spec, inverse, dst_zp)
