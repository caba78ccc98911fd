"""numpy model of int8 convolution, written from the definition (im2col, then the GEMM model).

``conv_sum`` is the int32 sum ``sum over window and input channels (x - zp_src) * w`` as
the kernels compute it: exactly, or (``faithful``) with VPMADDUBSW's saturating pairs,
which pair consecutive values of K ordered (kd, kh, kw, ic) with each position's input
channels zero-padded to a multiple of 4 (the packed layout). The padding of the source
holds the source zero point, so it contributes 0. ``halve`` models the halve_weights
policy (weights * 0.5 rounded to nearest even; the caller scales the result by 2).

Example::

    >>> import numpy as np
    >>> x = np.ones((1, 1, 3, 3), np.uint8); w = np.ones((1, 1, 3, 3), np.int8)
    >>> conv_sum(x, w, (1, 1), (1, 1), (1, 1), (0, 0))[0, 0].tolist()
    [[4, 6, 4], [6, 9, 6], [4, 6, 4]]
"""
from __future__ import annotations

import itertools

import numpy as np

from primitives.reference import gemm_sum, output_pipeline, wrap_int32


def conv_sum(x: np.ndarray, w: np.ndarray, strides, pad_l, pad_r, dilation, zp_src: int = 0, *,
             faithful: bool = False, halve: bool = False) -> np.ndarray:
    """x: (N, IC, *S) u8/s8 logical; w: (OC, IC, *K) or (G, OC/G, IC/G, *K) s8. Returns (N, OC, *O) int32."""
    n, ic = x.shape[:2]
    sp = x.ndim - 2
    grouped = w.ndim == x.ndim + 1
    groups = w.shape[0] if grouped else 1
    ocg, icg = (w.shape[1], w.shape[2]) if grouped else w.shape[:2]
    ker = w.shape[-sp:]
    icgp = -(-icg // 4) * 4
    pad = [(0, 0), (0, 0)] + [(a, b) for a, b in zip(pad_l, pad_r)]
    xp = np.pad(x, pad, constant_values=zp_src)
    out = [(xp.shape[2 + i] - ((ker[i] - 1) * (dilation[i] + 1) + 1)) // strides[i] + 1 for i in range(sp)]
    result = np.zeros((n, groups * ocg) + tuple(out), np.int32)
    for g in range(groups):
        xg = xp[:, g * icg:(g + 1) * icg]
        wg = w[g] if grouped else w
        cols, rows = [], []
        for pos in itertools.product(*[range(k) for k in ker]):
            sl = tuple(slice(p * (d + 1), p * (d + 1) + (o - 1) * s + 1, s)
                       for p, d, o, s in zip(pos, dilation, out, strides))
            patch = xg[(slice(None), slice(None)) + sl]  # (N, icg, *O)
            patch = np.moveaxis(patch, 1, -1).reshape(-1, icg)
            fill = np.full((patch.shape[0], icgp - icg), zp_src, x.dtype)  # padded channels: zero weights
            cols.append(np.concatenate([patch, fill], axis=1))
            wp = wg[(slice(None), slice(None)) + pos].T  # (icg, ocg)
            rows.append(np.concatenate([wp, np.zeros((icgp - icg, ocg), np.int8)]))
        a = np.concatenate(cols, axis=1)
        b = np.concatenate(rows, axis=0)
        if halve:
            b = np.rint(b.astype(np.float32) * np.float32(0.5)).astype(np.int8)
        v = wrap_int32(gemm_sum(a, b, zp_src, 0, faithful))  # (N*prod(O), ocg)
        result[:, g * ocg:(g + 1) * ocg] = np.moveaxis(v.reshape((n,) + tuple(out) + (ocg,)), -1, 1)
    return result


# Depthwise convolution (groups = channels), NHWC: the same sums without the im2col,
# vectorised over channels (the grouped conv_sum loops over 960 groups in Python).

def depthwise_sums(x_nhwc: np.ndarray, w: np.ndarray, zp_src: int = 0, strides=(1, 1), padding_l=(0, 0),
                   padding_r=(0, 0), dilation=(0, 0)) -> np.ndarray:
    """The exact sums ``sum (x - zp_src) * w`` (int64) in NHWC, padded taps contributing 0.

    ``x_nhwc``: (N, H, W, C) u8/s8; ``w``: (C, KH, KW) (or (C, 1, 1, KH, KW)) s8.
    """
    n, ih, iw, c = x_nhwc.shape
    w = np.asarray(w).reshape(c, w.shape[-2], w.shape[-1]).astype(np.int64)
    kh, kw = w.shape[1:]
    (sh, sw), (pt, pl), (pb, pr) = strides, padding_l, padding_r
    dh, dw = dilation[0] + 1, dilation[1] + 1
    oh = (ih + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (iw + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    # padded with zp, so padding contributes (zp - zp) * w = 0
    xp = np.full((n, ih + pt + pb, iw + pl + pr, c), zp_src, np.int64)
    xp[:, pt:pt + ih, pl:pl + iw] = x_nhwc
    xp -= zp_src
    out = np.zeros((n, oh, ow, c), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw]
            out += patch * w[:, i, j]
    return out


def depthwise_ref(x_nhwc, w, *, zp_src=0, strides=(1, 1), padding_l=(0, 0), padding_r=(0, 0), dilation=(0, 0),
                  dst_dt="s32", plain=False, **pipeline) -> np.ndarray:
    """The whole primitive in numpy: :func:`depthwise_sums`, wrapped to int32, then
    ``primitives.reference.output_pipeline`` on the (N*OH*OW, C) matrix of sums.

    ``pipeline``: scale, bias, post_ops, dst_old, dst_scale, dst_zp as ``output_pipeline``
    takes them, broadcast against (pixels, C); ``plain``: the integer-mode result.
    """
    sums = depthwise_sums(x_nhwc, w, zp_src, strides, padding_l, padding_r, dilation)
    shape = sums.shape
    v = wrap_int32(sums.reshape(-1, shape[-1]))
    if plain:
        return v.reshape(shape)
    if pipeline.get("dst_old") is not None:
        pipeline["dst_old"] = np.asarray(pipeline["dst_old"]).reshape(-1, shape[-1])
    return output_pipeline(v, dst_dt=dst_dt, **pipeline).reshape(shape)
