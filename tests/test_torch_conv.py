"""int8jit's convolution against PyTorch's quantized conv2d (torch==2.13.0), an independent peer.

Both sides get the same quantized tensors: quint8 activations x with a per-tensor scale
``s_src`` and zero point ``zp_src``, qint8 weights w (symmetric, zero point 0) with one
scale ``s_w`` or one per output channel, an f32 bias ``b`` in real units, and a quint8
output with scale ``s_dst`` and zero point ``zp_dst``. int8jit gets them as attributes:
``scales:src`` (mask 0), ``scales:weights`` (mask 0, or per OC: 1, grouped 3),
``scales:dst``, ``zero_points:src``/``zero_points:dst`` (mask 0) and the f32 bias as is
(int8jit adds it after the src * wei scaling, as PyTorch's bias is in real units).

With ``acc = sum (x - zp_src) * w`` (exact int32) int8jit computes, in f32
(``primitives.reference.output_pipeline``)::

    q = rint_half_even(clamp(f32(f32(acc) * f32(s_src * s_w)) + b) * f32(1 / s_dst) + zp_dst, 0, 255))

What PyTorch computes, found by experiment (ONEDNN_VERBOSE shows which library ran):

* engine ``x86`` (the default) hands the convolution to its bundled oneDNN (3.12 here)
  with exactly these attributes (``attr-scales:src0:0+dst:0+wei:0|1``,
  ``attr-zero-points:src0:0+dst:0``, ``bia:f32``). It applies the two scales one after the
  other, ``f32(f32(f32(acc) * s_src) * s_w)``, where oneDNN 3.2 (int8jit's cffi peer and
  its contract) multiplies by their f32 product (:func:`onednn312_model`). Observed on an
  AMD Zen 4 (AVX512-VNNI, ``brgconv_1x1``, ``brg_conv_fwd``, ``jit_int8`` and ``brdgmm_dw``
  implementations): the model equals PyTorch bit for bit on 1,933,856 outputs of these
  cases; int8jit differs from both by 1 on 2 of them, each a near-tie (the exact value
  within 1e-5 of a half-integer). Elsewhere the two agree bit for bit. Observed exception:
  with more than 100 groups (a wide depthwise layer) the x86 engine falls back to fbgemm
  (no oneDNN primitive runs), see below.
* engine ``onednn``: the same library, the same result (bit for bit).
* engine ``fbgemm`` requantizes with the scales folded into one multiplier and the bias
  divided into accumulator units, all in f32::

      aw = f32(s_src * s_w);  m = f32(aw / s_dst)
      q  = clamp(rint_half_even(f32(f32(acc) + f32(b / aw)) * m) + zp_dst, 0, 255)

  (:func:`fbgemm_model`, checked bit for bit against PyTorch's fbgemm engine). It is the
  same real number as int8jit's, rounded at different places, so the two differ by
  exactly 1 where the exact value lies within an f32 rounding error of a half-integer:
  about 1 output in 10^5-10^6 for random data (1 of 800,640 in the experiment), shown
  deterministically by :func:`test_requantization_order_differs`. Neither is wrong;
  the test asserts |int8jit - fbgemm| <= 1 on at most 0.1% of outputs.
* fbgemm's depthwise kernel (used by ``fbgemm``, and by ``x86`` above 100 groups)
  saturates: with weights over the full s8 range its outputs differ from the exact
  convolution by up to ~30 on ~10% of outputs; with |w| <= 63 (so that a pair of products
  2 * 255 * 63 < 32767 cannot overflow s16) it equals :func:`fbgemm_model` bit for bit.
  This is the VPMADDUBSW s16 saturation int8jit's ``exact`` policy avoids. The fbgemm
  comparisons therefore use |w| <= 63; the x86/onednn ones use the full range
  on an AVX512-VNNI CPU (elsewhere oneDNN saturates too: :func:`_onednn_wmax`).

Skipped when torch cannot be imported (``pip install .[peers]`` installs torch==2.13.0).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

try:
    import torch
except ImportError as why:  # pragma: no cover - depends on the environment
    pytest.skip(f"torch cannot be imported ({why}); pip install '.[peers]' installs torch==2.13.0",
                allow_module_level=True)

from primitives.attr import Attr
from primitives.conv import ConvolutionDesc
from primitives.conv_ref import conv_sum
from primitives.memory import desc
from runtime import isa as isa_mod

f32 = np.float32
ENGINES = tuple(torch.backends.quantized.supported_engines)
# name: (N, IC, OC, H, W, kernel, stride, pad, groups)
CASES = {
    "3x3_pad1": (1, 32, 48, 9, 9, 3, 1, 1, 1),
    "1x1": (2, 64, 32, 7, 7, 1, 1, 0, 1),
    "1x1_stride2_projection": (1, 32, 64, 8, 8, 1, 2, 0, 1),
    "stem_7x7_stride2_3to64": (1, 3, 64, 32, 32, 7, 2, 3, 1),
    "3x3_stride2_groups3": (1, 24, 48, 9, 9, 3, 2, 1, 3),
    "depthwise_3x3": (1, 32, 32, 10, 10, 3, 1, 1, 32),
    "3x3_nopad_rect": (1, 16, 16, 6, 11, 3, 1, 0, 1),
}


@pytest.fixture(autouse=True)
def _torch_state():
    engine, threads = torch.backends.quantized.engine, torch.get_num_threads()
    torch.set_num_threads(1)  # 2 cores shared by several sessions
    yield
    torch.backends.quantized.engine = engine
    torch.set_num_threads(threads)


def _need(engine: str) -> None:
    if engine not in ENGINES:
        pytest.skip(f"PyTorch's quantized engine {engine!r} is not built in (supported: {ENGINES})")


def make_problem(case, per_oc: bool, seed: int, wmax: int = 127, **over) -> dict:
    """Random quantized tensors and quantization parameters; scales are f32 values."""
    n, ic, oc, h, w_, k, stride, pad, groups = CASES[case] if isinstance(case, str) else case
    rng = np.random.default_rng(seed)
    p = dict(n=n, ic=ic, oc=oc, h=h, w=w_, k=k, stride=stride, pad=pad, groups=groups,
             x=rng.integers(0, 256, (n, ic, h, w_)).astype(np.uint8),
             wei=rng.integers(-wmax, wmax + 1, (oc, ic // groups, k, k)).astype(np.int8),
             s_w=rng.uniform(0.001, 0.01, oc if per_oc else 1).astype(f32),
             bias=rng.uniform(-20, 20, oc).astype(f32),
             s_src=f32(rng.uniform(0.005, 0.05)), zp_src=int(rng.integers(0, 256)),
             s_dst=f32(rng.uniform(0.05, 0.5)), zp_dst=int(rng.integers(64, 192)), per_oc=per_oc)
    p.update(over)
    return p


def torch_conv(p: dict, engine: str) -> np.ndarray:
    """PyTorch's quantized conv2d (NHWC activations); returns the u8 output as (N, OC, OH, OW)."""
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated in 2.13
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(p["x"]), float(p["s_src"]), p["zp_src"])
        qx = qx.contiguous(memory_format=torch.channels_last)
        w = torch.from_numpy(p["wei"])
        if p["per_oc"]:
            qw = torch._make_per_channel_quantized_tensor(
                w, torch.from_numpy(p["s_w"].astype(np.float64)), torch.zeros(p["oc"], dtype=torch.int64), 0)
        else:
            qw = torch._make_per_tensor_quantized_tensor(w, float(p["s_w"][0]), 0)
        packed = torch.ops.quantized.conv2d_prepack(qw, torch.from_numpy(p["bias"]), [p["stride"]] * 2,
                                                    [p["pad"]] * 2, [1, 1], p["groups"])
        out = torch.ops.quantized.conv2d(qx, packed, float(p["s_dst"]), p["zp_dst"])
    return out.int_repr().numpy().copy()


def _grouped_weights(p: dict) -> np.ndarray:
    g, oc, k = p["groups"], p["oc"], p["k"]
    return p["wei"].reshape(g, oc // g, p["ic"] // g, k, k) if g > 1 else p["wei"]


def int8jit_conv(p: dict) -> np.ndarray:
    """int8jit's ConvolutionDesc on the same tensors; returns (N, OC, OH, OW) u8."""
    n, ic, oc, k, s, pad, g = p["n"], p["ic"], p["oc"], p["k"], p["stride"], p["pad"], p["groups"]
    oh, ow = ((p["h"] + 2 * pad - k) // s + 1, (p["w"] + 2 * pad - k) // s + 1)
    w = _grouped_weights(p)
    wmask = (3 if g > 1 else 1) if p["per_oc"] else 0
    attr = Attr(scales={"src": 0, "weights": wmask, "dst": 0}, zero_points={"src": 0, "dst": 0})
    pd = ConvolutionDesc(desc((n, ic, p["h"], p["w"]), "u8", "nhwc"), desc(w.shape, "s8", "abcde"[:w.ndim]),
                         desc((n, oc, oh, ow), "u8", "nhwc"), desc((oc,), "f32", "a"), strides=(s, s),
                         padding_l=(pad, pad), padding_r=(pad, pad), attr=attr)
    dst = np.zeros((n, oh, ow, oc), np.uint8)
    pd.create().execute({"src": np.ascontiguousarray(np.moveaxis(p["x"], 1, -1)), "weights": w, "dst": dst,
                         "bias": p["bias"], "scales:src": np.float32([p["s_src"]]), "scales:weights": p["s_w"],
                         "scales:dst": np.float32([p["s_dst"]]), "zero_points:src": np.int32([p["zp_src"]]),
                         "zero_points:dst": np.int32([p["zp_dst"]])})
    return np.moveaxis(dst, -1, 1)


def _acc(p: dict) -> np.ndarray:
    s, pad = p["stride"], p["pad"]
    return conv_sum(p["x"], _grouped_weights(p), (s, s), (pad, pad), (pad, pad), (0, 0), p["zp_src"])


def fbgemm_model(p: dict) -> np.ndarray:
    """PyTorch fbgemm's requantization as observed (module docstring), on the exact int32 sum."""
    acc = _acc(p).astype(f32)
    cols = (1, p["oc"], 1, 1)
    aw = (p["s_src"] * np.broadcast_to(p["s_w"], (p["oc"],))).astype(f32).reshape(cols)
    m = (aw / p["s_dst"]).astype(f32)
    f = ((acc + (p["bias"].reshape(cols) / aw).astype(f32)).astype(f32) * m).astype(f32)
    return np.clip(np.rint(f) + p["zp_dst"], 0, 255).astype(np.uint8)


def onednn312_model(p: dict) -> np.ndarray:
    """PyTorch's bundled oneDNN's requantization as observed (module docstring), on the exact
    int32 sum: the src and weight scales in two f32 multiplies, then as int8jit's pipeline."""
    acc = _acc(p).astype(f32)
    cols = (1, p["oc"], 1, 1)
    sw = np.broadcast_to(p["s_w"], (p["oc"],)).reshape(cols)
    f = ((acc * p["s_src"]).astype(f32) * sw).astype(f32)
    f = ((f + p["bias"].reshape(cols)).astype(f32) * f32(1 / p["s_dst"])).astype(f32) + f32(p["zp_dst"])
    return np.clip(np.rint(f), 0, 255).astype(np.uint8)


def _exact_real(p: dict) -> np.ndarray:
    """The output before rounding, in float64 from the exact sum (no f32 rounding anywhere)."""
    cols = (1, p["oc"], 1, 1)
    s = np.float64(p["s_src"]) * np.broadcast_to(p["s_w"], (p["oc"],)).astype(np.float64).reshape(cols)
    return (_acc(p) * s + p["bias"].astype(np.float64).reshape(cols)) / np.float64(p["s_dst"]) + p["zp_dst"]


def _x86_is_onednn() -> bool:
    # Observed: x86 runs oneDNN on a VNNI machine. Elsewhere it may choose fbgemm.
    return isa_mod.cpu_supports("avx512_core_vnni")


def _onednn_wmax() -> int:
    """The weight range where PyTorch's oneDNN computes the exact sum here. Without VNNI it
    runs VPMADDUBSW and saturates (observed on an AMD Zen 3: 425-9,402 outputs of a case
    differ with full-range weights, none with |w| <= 63, where a pair cannot pass 32767).
    Full range only where the exact path was observed: AVX512-VNNI (AVX-VNNI is untried)."""
    return 127 if isa_mod.cpu_supports("avx512_core_vnni") else 63


@pytest.mark.parametrize("per_oc", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("engine", ["x86", "onednn"])
def test_onednn_backed_engines_equal_up_to_scale_order(engine, case, per_oc):
    """x86 (the default engine) and onednn: every output of PyTorch equals int8jit's or
    :func:`onednn312_model`'s (the two scale orders), and where int8jit's differs it is by 1
    at a near-tie (weights over the full range where oneDNN has VNNI, else |w| <= 63)."""
    _need(engine)
    if engine == "x86" and not _x86_is_onednn():
        pytest.skip("the x86 engine was observed to run oneDNN on avx512_core_vnni CPUs; this CPU lacks it")
    for seed in range(3):
        p = make_problem(case, per_oc, seed, wmax=_onednn_wmax())
        got, want = int8jit_conv(p), torch_conv(p, engine)
        assert got.shape == want.shape
        other = np.argwhere((want != got) & (want != onednn312_model(p)))
        assert other.size == 0, (f"engine {engine}, {case}, seed {seed}: {len(other)} of {got.size} outputs match "
                                 f"neither scale order, first at {other[:3].tolist()}")
        part = want != got
        off_tie = np.abs(_exact_real(p)[part] % 1 - 0.5) > 1e-4
        assert np.abs(got[part].astype(np.int32) - want[part]).max(initial=0) <= 1 and not off_tie.any(), (
            f"engine {engine}, {case}, seed {seed}: int8jit parts from PyTorch away from a near-tie")


def test_scale_orders_part_at_a_near_tie():
    """The two scale orders are the same real number rounded at different places: on this
    1x1 problem's output (0, 15, 6, 2), exactly 107.49999409, int8jit's f32(acc * f32(s_src * s_w))
    gives 107.49999 (so 107) and f32(f32(acc * s_src) * s_w) gives 107.5 (so 108); every
    other output agrees. PyTorch's oneDNN, where it runs, gives one of them."""
    p = make_problem("1x1", True, 2)
    ours, theirs = int8jit_conv(p), onednn312_model(p)
    assert np.argwhere(ours != theirs).tolist() == [[0, 15, 6, 2]]
    assert (int(ours[0, 15, 6, 2]), int(theirs[0, 15, 6, 2])) == (107, 108)
    assert abs(_exact_real(p)[0, 15, 6, 2] - 107.5) < 1e-5


@pytest.mark.parametrize("per_oc", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("case", list(CASES))
def test_fbgemm_engine_within_one(case, per_oc):
    """fbgemm: PyTorch equals fbgemm_model bit for bit; int8jit is within 1 on at most 0.1%."""
    _need("fbgemm")
    total = differ = 0
    for seed in range(3):
        p = make_problem(case, per_oc, seed, wmax=63)  # |w| <= 63: fbgemm's depthwise cannot saturate
        got, want = int8jit_conv(p), torch_conv(p, "fbgemm")
        np.testing.assert_array_equal(want, fbgemm_model(p), err_msg=f"fbgemm model, {case}, seed {seed}")
        d = np.abs(got.astype(np.int32) - want)
        assert d.max() <= 1, f"{case}, seed {seed}: int8jit and fbgemm differ by {d.max()}"
        total, differ = total + d.size, differ + int(np.count_nonzero(d))
    assert differ <= max(1, total // 1000), f"{case}: {differ} of {total} outputs differ by 1"


def test_requantization_order_differs():
    """One output where the two rounding orders part: 1x1 conv, 1 channel, x = 0..255, w = 43.

    For x = 119 the exact value lies so close to 57.5 that int8jit's
    f32(f32(acc * s) + b) * f32(1/s_dst) rounds to 57 and fbgemm's f32(acc + f32(b/aw)) * m
    to 58. The x86 engine (oneDNN) gives int8jit's 57; fbgemm gives 58; every other x agrees.
    """
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    p = dict(n=1, ic=1, oc=1, h=16, w=16, k=1, stride=1, pad=0, groups=1, x=x, wei=np.full((1, 1, 1, 1), 43, np.int8),
             s_w=np.float32([0.009576421231031418]), bias=np.float32([1.693962812423706]),
             s_src=f32(0.03997085615992546), zp_src=0, s_dst=f32(0.06352411955595016), zp_dst=0, per_oc=False)
    ours = int8jit_conv(p).reshape(-1)
    fb = fbgemm_model(p).reshape(-1)
    assert np.nonzero(ours != fb)[0].tolist() == [119] and (int(ours[119]), int(fb[119])) == (57, 58)
    exact = (119 * 43 * np.float64(p["s_src"]) * np.float64(p["s_w"][0]) + np.float64(p["bias"][0])) / np.float64(
        p["s_dst"])
    assert abs(exact - 57.5) < 1e-5  # a near-tie: either rounding is within f32 error
    if "fbgemm" in ENGINES:
        np.testing.assert_array_equal(torch_conv(p, "fbgemm").reshape(-1), fb)
    for engine in ("x86", "onednn"):
        if engine in ENGINES and (engine != "x86" or _x86_is_onednn()):
            np.testing.assert_array_equal(torch_conv(p, engine).reshape(-1), ours)


def test_x86_wide_depthwise_runs_fbgemm():
    """Above 100 groups the x86 engine takes fbgemm's depthwise kernel (observed): with |w| <= 63 it
    equals fbgemm_model bit for bit (and int8jit within 1); with full-range weights its s16
    saturation makes it differ from the exact convolution, which int8jit computes."""
    _need("x86")
    case = (1, 128, 128, 8, 8, 3, 1, 1, 128)
    p = make_problem(case, True, 5, wmax=63)
    want = torch_conv(p, "x86")
    np.testing.assert_array_equal(want, fbgemm_model(p))
    assert np.abs(int8jit_conv(p).astype(np.int32) - want).max() <= 1
    p = make_problem(case, True, 5)
    assert np.count_nonzero(torch_conv(p, "x86") != fbgemm_model(p)) > 0.01 * p["x"].size
