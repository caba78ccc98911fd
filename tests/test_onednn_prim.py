"""oneDNN's primitive API through tools.onednn_prim: the binding works, and oneDNN's
matmul / inner product / convolution agree with int8jit's.

oneDNN runs in a child process (tools.bench_sides' oneDNN server) capped at a VNNI
ISA: there both libraries are exact (no s16 saturation, no halved weights), so the
int32 products are equal, and the f32 pipelines agree operation for operation (src x
weight scale, bias, relu, times the dst scale's f32 reciprocal, round to nearest even):
the u8 outputs are equal bit for bit. The problems are
the benchmark's own (u8 src, s8 weights in the layout each library asked for, per-
channel weight scales, f32 bias, relu, u8 dst with a dst scale), on small shapes with
tails.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import skip_reason
from tools import onednn

REPO = Path(__file__).resolve().parent.parent
OK, WHY = onednn.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"oneDNN peer (libdnnl) cannot be loaded: {WHY}")

VNNI = ("avx512_core_vnni", "avx2_vnni")


def _vnni_isa():
    for isa in VNNI:
        if skip_reason(isa) is None:
            return isa
    return None


def _run_child(code: str, isa: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=onednn.child_env(isa, 1), cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", params=VNNI)
def server(request):
    """A oneDNN child capped at one VNNI path (skipped where the CPU lacks it)."""
    why = skip_reason(request.param)
    if why:
        pytest.skip(f"{why}: oneDNN is exact only on VNNI paths, the comparison needs one")
    from tools.bench_sides import OneDNNServer

    srv = OneDNNServer(request.param, 1)
    assert srv.info["isa"] == request.param, srv.info
    srv.isa = request.param
    yield srv
    srv.close()


def test_enum_values_and_queries_match_the_library():
    proc = _run_child("from tools.onednn_prim import main; raise SystemExit(main(['check']))")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agree with the library" in proc.stdout


def test_arg_ids():
    from tools.onednn_prim import arg_id

    assert arg_id("src") == 1 and arg_id("dst") == 17 and arg_id("weights") == 33 and arg_id("bias") == 41
    assert arg_id("scales:weights") == 4096 | 33
    assert arg_id("zero_points:src") == 8192 | 1
    assert arg_id("post_op:0:src_1") == 32768 | 2 and arg_id("post_op:1:src_1") == 65536 | 2
    with pytest.raises(ValueError, match="arg"):
        arg_id("nonsense")


def test_md_errors_name_the_argument():
    proc = _run_child(
        "from tools import onednn_prim as dp\n"
        "for bad in [lambda: dp.md((2, 3), 'f16', 'ab'), lambda: dp.md((2, 3), 'u8', 'abc'),\n"
        "            lambda: dp.md((2, 3), 'u8', 'zz')]:\n"
        "    try:\n        bad()\n    except ValueError as e:\n        print(str(e).split(':')[0])\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["dt", "tag", "tag"]


# Child-side check of the attribute plumbing the benchmarks do not use: zero points,
# a sum post-op, a user scratchpad; against a float64 numpy model.
_ATTR_CHILD = r"""
import json, numpy as np
from tools import onednn_prim as dp
rng = np.random.default_rng(7)
M, K, N = 9, 40, 35
a = rng.integers(0, 256, (M, K), dtype=np.uint8)
w = rng.integers(-128, 128, (K, N), dtype=np.int16).astype(np.int8)
old = rng.integers(0, 100, (M, N), dtype=np.uint8)
ws = rng.uniform(0.5, 1.5, N).astype(np.float32) / 4000
attr = dp.Attr(scales={"weights": 2}, zero_points={"src": 0, "dst": 0},
               post_ops=[("sum", 0.5, 0, None), ("eltwise", "relu", 0.0, 0.0)], scratchpad_mode="user")
p = dp.matmul(dp.md((M, K), "u8", "ab"), dp.md((K, N), "s8", "ab"), dp.md((M, N), "u8", "ab"), attr=attr)
c = old.copy()
sp = p.query_md("scratchpad")
run = p.bind({"src": a, "weights": w, "dst": c, "scales:weights": ws,
              "zero_points:src": np.int32([3]), "zero_points:dst": np.int32([10])})
run()
acc = (a.astype(np.int64) - 3) @ w.astype(np.int64)
x = np.maximum(acc * ws.astype(np.float64) + 0.5 * old, 0) + 10
ref = np.clip(np.rint(x), 0, 255)
d = np.abs(ref - c)
print(json.dumps({"max": float(d.max()), "bad": int((d > 0).sum()), "impl": p.impl_info(),
                  "sp": None if sp is None else sp.size}))
"""


def test_zero_points_sum_post_op_user_scratchpad():
    isa = _vnni_isa()
    if isa is None:
        pytest.skip("CPU lacks a VNNI path: oneDNN is not exact here")
    proc = _run_child(_ATTR_CHILD, isa)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["max"] <= 1 and got["bad"] <= 3, got


def _cases():
    from tools.bench_problems import _conv, _fc

    gemm = [_fc("tails", 5, 17, 33), _fc("blocks", 64, 96, 256), _fc("gemv", 1, 130, 520)]
    conv = [_conv("3x3 pad", 16, 9, 24, 3, 1), _conv("3x3/2", 8, 11, 16, 3, 2), _conv("1x1", 32, 7, 48, 1, 1),
            _conv("1x1/2", 16, 10, 32, 1, 2), _conv("7x7/2 3ch", 3, 20, 16, 7, 2),
            _conv("dw 3x3", 24, 9, 24, 3, 1, groups=24), _conv("dw 3x3/2", 40, 10, 40, 3, 2, groups=40)]
    out = [pytest.param(dict(c, prim=p), id=f"{p}-{c['label']}") for p in ("matmul", "ip") for c in gemm]
    out += [pytest.param(dict(c, prim="conv", N=n), id=f"conv-{c['label']}-n{n}") for c in conv for n in (1, 2)]
    return out


def _compare(a: np.ndarray, b: np.ndarray):
    assert a.shape == b.shape and a.dtype == b.dtype
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    return int(d.max()), int(np.count_nonzero(d))


@pytest.mark.parametrize("case", _cases())
def test_fused_output_equals_int8jit(server, case):
    from tools.bench_sides import RemoteSide, Unavailable, int8jit_setup

    try:
        mine = int8jit_setup(case, "fused", server.isa, 1)
    except Unavailable as exc:
        pytest.skip(str(exc))
    mine.call()
    peer = RemoteSide(server, "t", case, "fused")
    theirs = peer.output()
    server.request(op="free")
    worst, bad = _compare(mine.out, theirs)
    assert worst == 0, f"{bad} of {mine.out.size} outputs differ (by up to {worst}); oneDNN ran {peer.impl}"
    assert 0.05 < np.mean(theirs == 0) < 0.95, "the problem's scales should leave outputs in range"


@pytest.mark.parametrize("prim", ["matmul", "ip"])
def test_plain_s32_equals_int8jit(server, prim):
    from tools.bench_problems import _fc
    from tools.bench_sides import RemoteSide, int8jit_setup

    case = dict(_fc("plain", 7, 50, 300), prim=prim)
    mine = int8jit_setup(case, "plain", server.isa, 1)
    mine.call()
    theirs = RemoteSide(server, "t", case, "plain").output()
    server.request(op="free")
    np.testing.assert_array_equal(mine.out, theirs)


def test_onednn_pooling_matches_reference(server):
    from primitives.pooling_ref import pooling_ref
    from tools.bench_problems import _pool, pool_src
    from tools.bench_sides import RemoteSide

    for case in (_pool("max", "max", 2, 20, 13, 3, 2, 1), _pool("avg", "avg_exclude_padding", 1, 33, 9, 3, 2, 1)):
        case = dict(case, prim="pool")
        theirs = RemoteSide(server, "t", case, "fused").output()
        server.request(op="free")
        k, s, p = (case["K"],) * 2, (case["S"],) * 2, (case["P"],) * 2
        np.testing.assert_array_equal(theirs, pooling_ref(pool_src(case), case["alg"], k, s, p, p))


@pytest.mark.parametrize("isa", ["avx512_core", "avx2"])
def test_non_vnni_convolution_against_onednn(isa):
    """oneDNN 3.2's int8 convolution on a non-VNNI ISA, and int8jit's policies there.

    Measured, with a u8 source (the layers here): oneDNN 3.2 does not halve the weights;
    it runs VPMADDUBSW on the full weights and saturates, so int8jit's ``faithful`` equals
    it bit for bit, while ``exact`` and ``halve_weights`` differ (exact wherever a pair
    saturated, halve_weights wherever a weight was odd too). With an s8 source it halves
    them (the test below).
    """
    why = skip_reason(isa)
    if why:
        pytest.skip(why)
    from tools.bench_problems import _conv
    from tools.bench_sides import OneDNNServer, RemoteSide, int8jit_setup

    srv = OneDNNServer(isa, 1)
    try:
        if srv.info["isa"] != isa:
            pytest.skip(f"oneDNN would not cap itself at {isa}: {srv.info}")
        for case in (_conv("3x3 pad", 16, 9, 24, 3, 1), _conv("1x1", 32, 7, 48, 1, 1)):
            case = dict(case, prim="conv", N=1)
            theirs = RemoteSide(srv, "t", case, "fused").output()
            srv.request(op="free")
            out = {}
            for policy in ("faithful", "exact", "halve_weights"):
                side = int8jit_setup(dict(case, policy=policy), "fused", isa, 1)
                side.call()
                out[policy] = _compare(side.out, theirs)
            assert out["faithful"] == (0, 0), f"{case['label']}: faithful differs from oneDNN: {out}"
            assert out["exact"][1] > 0 and out["halve_weights"][1] > 0, out
    finally:
        srv.close()


# Zero-volume problems: (name, primitive, src dims, weights dims, dst dims). The child
# creates and runs each with oneDNN (dst filled with 7s first) and prints what happened.
_ZERO_CASES = [
    ("matmul M=0", "matmul", (0, 4), (4, 3), (0, 3)), ("matmul N=0", "matmul", (2, 4), (4, 0), (2, 0)),
    ("matmul K=0", "matmul", (2, 0), (0, 3), (2, 3)), ("matmul batch 0", "matmul", (0, 2, 3), (1, 3, 4), (0, 2, 4)),
    ("ip MB=0", "ip", (0, 4), (3, 4), (0, 3)), ("ip K=0", "ip", (2, 0), (3, 0), (2, 3)),
    ("ip OC=0", "ip", (2, 4), (0, 4), (2, 0)),
    ("conv N=0", "conv", (0, 4, 5, 5), (3, 4, 3, 3), (0, 3, 3, 3)),
    ("conv IC=0", "conv", (1, 0, 5, 5), (3, 0, 3, 3), (1, 3, 3, 3)),
    ("conv OC=0", "conv", (1, 4, 5, 5), (0, 4, 3, 3), (1, 0, 3, 3)),
    ("conv H=0", "conv", (1, 4, 0, 5), (3, 4, 1, 1), (1, 3, 0, 5)),
    ("pool N=0", "pool", (0, 3, 4, 4), None, (0, 3, 3, 3)), ("pool C=0", "pool", (1, 0, 4, 4), None, (1, 0, 3, 3)),
    ("reorder 0 rows", "reorder", (0, 4), None, (0, 4)),
]
_TAGS = {2: "ab", 3: "abc", 4: "nhwc"}

_ZERO_CHILD = r"""
import json, numpy as np
from tools import onednn_prim as dp
out = {}
for name, prim, s, w, d in CASES:
    tag = {2: "ab", 3: "abc", 4: "nhwc"}
    try:
        if prim == "matmul":
            p = dp.matmul(dp.md(s, "u8", tag[len(s)]), dp.md(w, "s8", tag[len(w)]), dp.md(d, "s32", tag[len(d)]))
        elif prim == "ip":
            p = dp.inner_product(dp.md(s, "u8", "ab"), dp.md(w, "s8", "ab"), dp.md(d, "s32", "ab"))
        elif prim == "conv":
            p = dp.convolution(dp.md(s, "u8", "nhwc"), dp.md(w, "s8", "oihw"), dp.md(d, "s32", "nhwc"),
                               strides=(1, 1), padding_l=(0, 0), padding_r=(0, 0))
        elif prim == "pool":
            p = dp.pooling("max", dp.md(s, "u8", "nhwc"), dp.md(d, "u8", "nhwc"), strides=(1, 1), kernel=(2, 2),
                           padding_l=(0, 0), padding_r=(0, 0))
        else:
            p = dp.reorder(dp.md(s, "f32", "ab"), dp.md(d, "u8", "ab"))
    except dp.OneDNNError:
        out[name] = "refused"
        continue
    phys = lambda dims: tuple(dims[i] for i in ((0, 2, 3, 1) if len(dims) == 4 else range(len(dims))))
    dst = np.full(phys(d), 7, np.uint8 if prim in ("pool", "reorder") else np.int32)
    args = {"src": np.zeros(phys(s), np.float32 if prim == "reorder" else np.uint8), "dst": dst}
    if w is not None:
        args["weights"] = np.zeros(w, np.int8)
    p.bind(args)()
    out[name] = "no-op" if (dst == 7).all() else "wrote"
print(json.dumps(out))
"""


def _int8jit_zero_case(prim, s, w, d) -> str:
    from primitives.conv import ConvolutionDesc
    from primitives.matmul import InnerProductDesc, MatmulDesc
    from primitives.memory import desc
    from primitives.pooling import PoolingDesc
    from primitives.reorder import ReorderDesc
    from runtime.isa import NoIsaPathError

    try:
        if prim == "matmul":
            pd = MatmulDesc(desc(s, "u8", _TAGS[len(s)]), desc(w, "s8", _TAGS[len(w)]), desc(d, "s32", _TAGS[len(d)]))
        elif prim == "ip":
            pd = InnerProductDesc(desc(s, "u8", "ab"), desc(w, "s8", "ab"), desc(d, "s32", "ab"))
        elif prim == "conv":
            pd = ConvolutionDesc(desc(s, "u8", "nhwc"), desc(w, "s8", "oihw"), desc(d, "s32", "nhwc"))
        elif prim == "pool":
            pd = PoolingDesc("max", desc(s, "u8", "nhwc"), desc(d, "u8", "nhwc"), 1, 2, 0, 0)
        else:
            pd = ReorderDesc(desc(s, "f32", "ab"), desc(d, "u8", "ab"))
    except NoIsaPathError:
        raise  # not a refusal of the dims: this CPU runs no path (the test skips)
    except ValueError:
        return "refused"
    dst = np.full(pd.dst_desc().physical_shape, 7, pd.dst_desc().numpy_dtype)
    args = {"src": np.zeros(pd.src_desc().physical_shape, pd.src_desc().numpy_dtype), "dst": dst}
    if w is not None:
        args["weights"] = np.zeros(w, np.int8)
    pd.create().execute(args)
    return "no-op" if (dst == 7).all() else "wrote"


def test_zero_volume_problems_as_onednn_takes_them():
    """int8jit takes a 0 where oneDNN 3.2 does and runs such a primitive as a no-op; two
    differences, by choice (README, numerics contract): a matmul with K = 0 writes the
    output stage of 0 (here 0s: numpy's answer; oneDNN leaves dst as it was), and a
    convolution refuses a spatial 0 (oneDNN takes one where the output is empty too)."""
    proc = _run_child(f"CASES = {_ZERO_CASES!r}\n" + _ZERO_CHILD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    mine = {name: _int8jit_zero_case(prim, s, w, d) for name, prim, s, w, d in _ZERO_CASES}
    differ = {name: (mine[name], theirs[name]) for name in mine if mine[name] != theirs[name]}
    assert differ == {"matmul K=0": ("wrote", "no-op"), "conv H=0": ("refused", "no-op")}, (mine, theirs)
    assert sorted(n for n, v in mine.items() if v == "refused") == ["conv H=0", "conv IC=0", "conv OC=0", "ip K=0",
                                                                    "ip OC=0"]


_BROADCAST_CHILD = r"""
import json, numpy as np
from tools import onednn_prim as dp
out = {}
for sb, wb, db in CASES:
    rng = np.random.default_rng(sb * 100 + wb * 10 + db)
    a = rng.integers(0, 256, (sb, 4, 9)).astype(np.uint8)
    w = rng.integers(-63, 64, (wb, 9, 5)).astype(np.int8)
    try:
        p = dp.matmul(dp.md(a.shape, "u8", "abc"), dp.md(w.shape, "s8", "abc"), dp.md((db, 4, 5), "s32", "abc"))
    except dp.OneDNNError:
        out[f"{sb},{wb},{db}"] = "refused"
        continue
    c = np.zeros((db, 4, 5), np.int32)
    p.bind({"src": a, "weights": w, "dst": c})()
    out[f"{sb},{wb},{db}"] = c.tolist()
print(json.dumps(out))
"""


def test_matmul_batch_broadcast_as_onednn_takes_it():
    """src's or weights' batch dim of 1 broadcasts to dst's, in oneDNN 3.2 as in int8jit
    (the same s32 results; weights within +-63, so no path of either saturates), and
    both refuse a dst batch that the two do not broadcast to."""
    from primitives.matmul import MatmulDesc
    from primitives.memory import desc

    cases = [(1, 3, 3), (3, 1, 3), (3, 3, 3), (1, 1, 3), (2, 3, 3)]
    proc = _run_child(f"CASES = {cases!r}\n" + _BROADCAST_CHILD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for sb, wb, db in cases:
        rng = np.random.default_rng(sb * 100 + wb * 10 + db)
        a = rng.integers(0, 256, (sb, 4, 9)).astype(np.uint8)
        w = rng.integers(-63, 64, (wb, 9, 5)).astype(np.int8)
        try:
            pd = MatmulDesc(desc(a.shape, "u8", "abc"), desc(w.shape, "s8", "abc"), desc((db, 4, 5), "s32", "abc"))
        except ValueError:
            assert theirs[f"{sb},{wb},{db}"] == "refused", (sb, wb, db)
            continue
        c = np.zeros((db, 4, 5), np.int32)
        pd.create().execute({"src": a, "weights": w, "dst": c})
        assert c.tolist() == theirs[f"{sb},{wb},{db}"], (sb, wb, db)
        np.testing.assert_array_equal(c, np.matmul(a.astype(np.int64), w.astype(np.int64)))


_BINARY_CHILD = r"""
import json, numpy as np
from tools import onednn_prim as dp
out = {}
for alg, dims in CASES:
    rng = np.random.default_rng(len(out))
    a = rng.integers(0, 256, (6, 9)).astype(np.uint8)
    w = rng.integers(-63, 64, (9, 5)).astype(np.int8)
    src1 = (rng.integers(-8, 9, dims) / 4).astype(np.float32)
    src1[src1 == 0] = 0.5  # (div)
    attr = dp.Attr(post_ops=[("binary", alg, dp.md(dims, "f32", "ab")), ("binary", "add", dp.md((1, 5), "f32", "ab"))])
    p = dp.matmul(dp.md(a.shape, "u8", "ab"), dp.md(w.shape, "s8", "ab"), dp.md((6, 5), "f32", "ab"), attr=attr)
    c = np.zeros((6, 5), np.float32)
    p.bind({"src": a, "weights": w, "dst": c, "post_op:0:src_1": src1,
            "post_op:1:src_1": np.arange(5, dtype=np.float32)})()
    out[f"{alg} {dims}"] = [a.tolist(), w.tolist(), src1.tolist(), c.tolist()]
print(json.dumps(out))
"""


def test_binary_post_ops_as_onednn_computes_them():
    """Binary post-ops (two in a chain: the second's operand is argument post_op:1:src_1,
    oneDNN 3's DNNL_ARG_ATTR_MULTIPLE_POST_OP(1)) give oneDNN's results, operands of one
    value, one per column, one per row and full. The peer had numbered them as oneDNN 2
    did, which oneDNN 3.2 refuses."""
    from primitives.attr import Attr, PostOps
    from primitives.matmul import MatmulDesc
    from primitives.memory import desc

    cases = [("add", (1, 1)), ("mul", (1, 5)), ("max", (6, 1)), ("min", (6, 5)), ("sub", (1, 5)), ("div", (6, 5))]
    proc = _run_child(f"CASES = {cases!r}\n" + _BINARY_CHILD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for alg, dims in cases:
        a, w, src1, want = (np.array(x) for x in theirs[f"{alg} {dims}"])
        po = PostOps().binary(alg, desc(dims, "f32", "ab")).binary("add", desc((1, 5), "f32", "ab"))
        pd = MatmulDesc(desc((6, 9), "u8", "ab"), desc((9, 5), "s8", "ab"), desc((6, 5), "f32", "ab"),
                        attr=Attr(post_ops=po))
        c = np.zeros((6, 5), np.float32)
        pd.create().execute({"src": a.astype(np.uint8), "weights": w.astype(np.int8), "dst": c,
                             "post_op:0:src_1": src1.astype(np.float32),
                             "post_op:1:src_1": np.arange(5, dtype=np.float32)})
        np.testing.assert_array_equal(c, want.astype(np.float32), err_msg=f"{alg} {dims}")


_S8_CONV_CHILD = r"""
import json, numpy as np
from tools import onednn_prim as dp
rng = np.random.default_rng(5)
x = rng.integers(-128, 128, (1, 7, 7, 16)).astype(np.int8)  # (nhwc)
w = rng.integers(-63, 64, (16, 16, 3, 3)).astype(np.int8)   # (no pair can saturate)
p = dp.convolution(dp.md((1, 16, 7, 7), "s8", "nhwc"), dp.md(w.shape, "s8", "any"), dp.md((1, 16, 5, 5), "s32", "nhwc"),
                   strides=(1, 1), padding_l=(0, 0), padding_r=(0, 0))
y = np.zeros((1, 5, 5, 16), np.int32)
p.bind({"src": x, "weights": p.reorder_weights(w, "oihw"), "dst": y})()
print(json.dumps({"impl": p.impl_info(), "x": x.tolist(), "w": w.tolist(), "y": y.tolist()}))
"""


@pytest.mark.parametrize("isa", ["avx512_core", "avx2"])
def test_non_vnni_s8_source_convolution_halves_in_onednn(isa):
    """Measured: with an s8 source, oneDNN 3.2's non-VNNI JIT convolutions halve the
    weights (the seeds' trick), even where no pair could saturate: int8jit's
    ``halve_weights`` equals them bit for bit, ``faithful`` (and ``exact``) do not. With
    a u8 source they saturate instead (the test above): the README says which is which."""
    why = skip_reason(isa)
    if why:
        pytest.skip(why)
    from primitives.attr import Attr
    from primitives.conv import ConvolutionDesc
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    proc = _run_child(_S8_CONV_CHILD, isa)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got["impl"].startswith("ref"):
        pytest.skip(f"oneDNN took its reference convolution: {got['impl']}")
    x, w, theirs = np.int8(got["x"]), np.int8(got["w"]), np.int32(got["y"])
    same = {}
    for policy in ("halve_weights", "faithful"):
        pd = ConvolutionDesc(desc((1, 16, 7, 7), "s8", "nhwc"), desc(w.shape, "s8", "any"),
                             desc((1, 16, 5, 5), "s32", "nhwc"), attr=Attr(policy=policy), isa=isa)
        wm = Memory(pd.weights_desc())
        reorder_desc(desc(w.shape, "s8", "oihw"), pd.weights_desc()).create().execute({"src": w, "dst": wm})
        y = np.zeros((1, 5, 5, 16), np.int32)
        pd.create().execute({"src": x, "weights": wm, "dst": y})
        same[policy] = bool(np.array_equal(y, theirs))
    assert same == {"halve_weights": True, "faithful": False}, (got["impl"], same)
