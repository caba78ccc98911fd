"""The sides ``int8jit-bench matmul / ip / conv / pool`` compares, each set up on one
problem (:mod:`tools.bench_problems`) as a zero-argument call: int8jit's primitive in
this process, oneDNN's in a child process capped at the row's ISA path and thread
count (a small server that creates and times primitives on request), PyTorch's
quantized conv2d in this process.

>>> from tools.bench_problems import GEMM_SHAPES
>>> from tools.bench_sides import int8jit_setup
>>> side = int8jit_setup(dict(GEMM_SHAPES[0], prim="ip"), "plain", None, 1)
>>> side.call(); side.out.shape, side.out.dtype
((128, 768), dtype('int32'))
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from tools.bench_problems import (conv_operands, conv_out, conv_weight_dims, gemm_operands, pool_out, pool_spatial,
                                  pool_src)
from tools.bench_timing import REPO_ROOT, Unavailable, in_turn, timed_calls

# ------------------------------------------------------------------ int8jit side

@dataclass
class Side:
    """One side's set-up problem: a zero-argument call, its output, what it ran."""

    call: object
    out: np.ndarray | None
    impl: str = ""
    create_ms: float | None = None
    bind: object = None  # int8jit: makes the bound call (Primitive.bind) of the same arguments


def int8jit_setup(case, variant: str, isa: str, threads: int) -> Side:
    prim = case["prim"]
    if prim in ("matmul", "ip"):
        return _int8jit_gemm(case, variant, isa, threads)
    if prim == "conv":
        return _int8jit_conv(case, isa, threads)
    return _int8jit_pool(case, isa, threads)


def _int8jit_gemm(case, variant, isa, threads) -> Side:
    from primitives.attr import Attr, PostOps
    from primitives.matmul import InnerProductDesc, MatmulDesc
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    M, N, K = case["M"], case["N"], case["K"]
    A, W, bias, wscale, dscale = gemm_operands(case)
    fused = variant == "fused"
    ip = case["prim"] == "ip"
    # The logical weights the reorder reads (an inner product's OC x K): the user's data,
    # made before the clock as on oneDNN's side (the 16 MB transpose of 64x4096x4096 took
    # 100-200 ms, more than the creation it was counted in).
    w_dims, w_logical = ((N, K), np.ascontiguousarray(W.T)) if ip else ((K, N), W)
    batch, plain, wtag = _batch(case)
    if batch:  # (attention's heads: the weights' logical view of their memory order)
        w_dims, w_logical = (case["B"], K, N), _in_memory_order(W, wtag).transpose(0, 2, 1) if wtag == "acb" else W
    t0 = time.perf_counter()
    policy = case.get("policy", "exact")
    if fused:
        attr = Attr(scales={"src": 0, "weights": 1 if ip else 1 << (len(plain) - 1), "dst": 0},
                    policy=policy).set_post_ops(PostOps().eltwise("relu"))
        bias_md = desc((N,), "f32", "a") if ip else desc((1,) * (len(plain) - 1) + (N,), "f32", plain)
    else:
        attr, bias_md = Attr(policy=policy), None
    dst_dt = "u8" if fused else "s32"
    cls = InnerProductDesc if ip else MatmulDesc
    runtime = case.get("runtime", False)
    pd = cls(desc(batch + (M, K), "u8", plain), desc(w_dims, "s8", wtag if runtime else "any"),
             desc(batch + (M, N), dst_dt, plain), bias_md, attr=attr, isa=isa, threads=threads)
    p = pd.create()
    create_ms = 1e3 * (time.perf_counter() - t0)
    wmem = w_logical  # runtime weights: the plain array, packed by every call
    if not runtime:
        wmem = Memory(pd.weights_desc())
        reorder_desc(desc(w_dims, "s8", "ab"), pd.weights_desc()).create().execute({"src": w_logical, "dst": wmem})
    C = np.zeros(batch + (M, N), np.uint8 if fused else np.int32)
    args = {"src": A, "weights": wmem, "dst": C}
    if fused:
        args.update({"bias": bias if ip else bias.reshape(bias_md.dims), "scales:src": np.float32([1.0]),
                     "scales:weights": wscale, "scales:dst": dscale})
    info = pd.impl_info()
    return Side(_caller(p, args, case), C, f"{info.get('impl', '')}", create_ms, bind=lambda: p.bind(args))


def _caller(p, args: dict, case):
    """The timed call: ``p.execute(args)``, or (``--new-arrays``) with new array objects
    of the same memory at every call, as a loop that makes its arrays anew passes them
    (no replay of the last call's very arrays: its calls are moved to the new ones)."""
    execute = p.execute
    if case.get("new_arrays"):
        arrays = [(k, v) for k, v in args.items() if isinstance(v, np.ndarray)]
        others = {k: v for k, v in args.items() if not isinstance(v, np.ndarray)}

        def call_new():
            execute({**others, **{k: v[...] for k, v in arrays}})
        return call_new

    def call():
        execute(args)
    return call


def _batch(case) -> tuple[tuple, str, str]:
    """A matmul case's batch dims (attention's heads: ``B``, or none), its plain tag and
    the runtime weights' tag (``wtag``: acb or abc for a batch; ab)."""
    if "B" in case:
        return (case["B"],), "abc", case["wtag"]
    return (), "ab", "ab"


def _in_memory_order(w: np.ndarray, tag: str) -> np.ndarray:
    """Logical (B, K, N) weights as the bytes of ``tag`` lay them out (acb: (B, N, K))."""
    return np.ascontiguousarray(w.transpose(0, 2, 1)) if tag == "acb" else w


def _int8jit_conv(case, isa, threads) -> Side:
    try:
        from primitives.conv import ConvolutionDesc
    except ImportError as exc:
        raise Unavailable(f"int8jit conv not available yet ({exc})") from None
    from primitives.attr import Attr, PostOps
    from primitives.memory import Memory, desc
    from primitives.reorder import reorder_desc

    x, w, bias, wscale, dscale = conv_operands(case)
    n, oc = case["N"], case["OC"]
    oh, ow = conv_out(case)
    w_dims, w_tag, w_mask = conv_weight_dims(case)
    attr = Attr(scales={"weights": w_mask, "dst": 0}, policy=case.get("policy", "exact")).set_post_ops(
        PostOps().eltwise("relu"))
    t0 = time.perf_counter()
    pd = ConvolutionDesc(desc((n, case["IC"], case["IH"], case["IW"]), "u8", "nhwc"), desc(w_dims, "s8", "any"),
                         desc((n, oc, oh, ow), "u8", "nhwc"), desc((oc,), "f32", "a"),
                         strides=(case["S"], case["S"]), padding_l=(case["P"], case["P"]),
                         padding_r=(case["P"], case["P"]), attr=attr, isa=isa, threads=threads)
    p = pd.create()
    create_ms = 1e3 * (time.perf_counter() - t0)
    wmem = Memory(pd.weights_desc())
    reorder_desc(desc(w_dims, "s8", w_tag), pd.weights_desc()).create().execute(
        {"src": w.reshape(w_dims), "dst": wmem})
    y = np.zeros((n, oh, ow, oc), np.uint8)
    args = {"src": x, "weights": wmem, "bias": bias, "dst": y, "scales:weights": wscale, "scales:dst": dscale}
    info = pd.impl_info() if hasattr(pd, "impl_info") else {}
    return Side(_caller(p, args, case), y, str(info.get("impl", "")), create_ms, bind=lambda: p.bind(args))


def _int8jit_pool(case, isa, threads) -> Side:
    from primitives.pooling import bench_case

    t0 = time.perf_counter()
    run, _, _ = bench_case(case["N"], case["C"], case["H"], case["W"], case["K"], case["S"], case["P"],
                           case["alg"], "u8", isa=isa, threads=threads, seed=0, d=case.get("D"))
    return Side(run, None, "", 1e3 * (time.perf_counter() - t0))


# ------------------------------------------------------------------ oneDNN side (child)

def onednn_setup(case, variant: str) -> Side:
    from tools import onednn_prim as dp

    prim = case["prim"]
    if prim in ("matmul", "ip"):
        M, N, K = case["M"], case["N"], case["K"]
        A, W, bias, wscale, dscale = gemm_operands(case)
        fused = variant == "fused"
        ip = prim == "ip"
        batch, plain, wtag = _batch(case)
        attr = dp.Attr(scales={"src": 0, "weights": 1 if ip else 1 << (len(plain) - 1), "dst": 0},
                       post_ops=[("eltwise", "relu", 0.0, 0.0)]) if fused else None
        w_dims, w_logical = ((N, K), np.ascontiguousarray(W.T)) if ip else ((K, N), W)
        if batch:
            w_dims, w_logical = (case["B"], K, N), _in_memory_order(W, wtag)
        bias_dims = (N,) if ip else (1,) * (len(plain) - 1) + (N,)
        bias_md = (dp.md((N,), "f32", "a") if ip else dp.md(bias_dims, "f32", plain)) if fused else None
        make = dp.inner_product if ip else dp.matmul
        t0 = time.perf_counter()
        runtime = case.get("runtime", False)
        p = make(dp.md(batch + (M, K), "u8", plain), dp.md(w_dims, "s8", wtag if runtime else "any"),
                 dp.md(batch + (M, N), "u8" if fused else "s32", plain), bias_md, attr=attr)
        create_ms = 1e3 * (time.perf_counter() - t0)
        wp = w_logical if runtime else p.reorder_weights(w_logical, "ab")
        C = np.zeros(batch + (M, N), np.uint8 if fused else np.int32)
        args = {"src": A, "weights": wp, "dst": C}
        if fused:
            args.update({"bias": bias.reshape(bias_dims), "scales:src": np.float32([1.0]), "scales:weights": wscale,
                         "scales:dst": dscale})
        return Side(p.bind(args), C, p.impl_info(), create_ms)
    if prim == "conv":
        x, w, bias, wscale, dscale = conv_operands(case)
        n, oc = case["N"], case["OC"]
        oh, ow = conv_out(case)
        w_dims, w_tag, w_mask = conv_weight_dims(case)
        attr = dp.Attr(scales={"weights": w_mask, "dst": 0}, post_ops=[("eltwise", "relu", 0.0, 0.0)])
        t0 = time.perf_counter()
        p = dp.convolution(dp.md((n, case["IC"], case["IH"], case["IW"]), "u8", "nhwc"), dp.md(w_dims, "s8", "any"),
                           dp.md((n, oc, oh, ow), "u8", "nhwc"), dp.md((oc,), "f32", "a"),
                           strides=(case["S"],) * 2, padding_l=(case["P"],) * 2, padding_r=(case["P"],) * 2,
                           attr=attr)
        create_ms = 1e3 * (time.perf_counter() - t0)
        wp = p.reorder_weights(w.reshape(w_dims), w_tag)
        y = np.zeros((n, oh, ow, oc), np.uint8)
        run = p.bind({"src": x, "weights": wp, "bias": bias, "dst": y, "scales:weights": wscale,
                      "scales:dst": dscale})
        return Side(run, y, p.impl_info(), create_ms)
    x = pool_src(case)
    outs, spatial = pool_out(case), pool_spatial(case)
    n, c, nd = case["N"], case["C"], len(spatial)
    tag = "acdb" if nd == 2 else "acdeb"  # nhwc, ndhwc
    t0 = time.perf_counter()
    p = dp.pooling(case["alg"], dp.md((n, c) + spatial, "u8", tag), dp.md((n, c) + outs, "u8", tag),
                   strides=(case["S"],) * nd, kernel=(case["K"],) * nd, padding_l=(case["P"],) * nd,
                   padding_r=(case["P"],) * nd)
    create_ms = 1e3 * (time.perf_counter() - t0)
    y = np.zeros((n,) + outs + (c,), np.uint8)
    return Side(p.bind({"src": x, "dst": y}), y, p.impl_info(), create_ms)


def _server() -> None:
    """Child side: JSON requests on stdin, one JSON answer line each on stdout."""
    from tools import onednn, onednn_prim as dp

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the answer channel
    sides: dict = {}
    dp.engine()

    def answer(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    answer({"isa": onednn.effective_isa(), "version": onednn.version(), "threads": onednn.max_threads()})
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "setup":
                side = sides[req["id"]] = onednn_setup(req["case"], req["variant"])
                side.call()
                answer({"impl": side.impl, "create_ms": side.create_ms})
            elif op == "time":
                answer({"s": timed_calls(sides[req["id"]].call, req["n"])})
            elif op == "chain":  # the layers one after another, as a network calls them
                answer({"s": timed_calls(in_turn([sides[i].call for i in req["ids"]]), req["n"])})
            elif op == "save":
                np.save(req["path"], sides[req["id"]].out)
                answer({})
            elif op == "free":
                sides.clear()
                answer({})
            elif op == "creation":  # cold creations: oneDNN's primitive cache off
                dp.set_primitive_cache_capacity(0)
                times = []
                for _ in range(req.get("repeats", 3)):
                    times.append(onednn_setup(req["case"], req["variant"]).create_ms)
                dp.set_primitive_cache_capacity(1024)
                answer({"ms": min(times)})
            elif op == "quit":
                break
            else:
                answer({"error": f"unknown op {op}"})
        except Exception as exc:
            answer({"error": f"{type(exc).__name__}: {exc}"})
    out.flush()
    os._exit(0)  # no interpreter teardown under OpenMP's idle threads


class OneDNNServer:
    """A oneDNN child capped at ``isa`` with ``threads`` OpenMP threads."""

    def __init__(self, isa: str, threads: int):
        from tools import onednn

        ok, why = onednn.available()
        if not ok:
            raise Unavailable(f"oneDNN unavailable: {why}")
        self.err = tempfile.TemporaryFile(mode="w+")  # a file: a chatty child never blocks on it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.bench_sides", "_onednn-server"], env=onednn.child_env(isa, threads),
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.info = self._read()
        self.note = "" if self.info.get("isa") == isa else f"oneDNN ran {self.info.get('isa')}"

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            self.err.seek(0)
            err = self.err.read()[-400:]
            raise Unavailable(f"oneDNN child ended ({self.proc.poll()}): {err.strip()}")
        return json.loads(line)

    def request(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        got = self._read()
        if "error" in got:
            raise Unavailable(f"oneDNN: {got['error']}")
        return got

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()


class RemoteSide:
    def __init__(self, server: OneDNNServer, ident: str, case, variant):
        self.server, self.id = server, ident
        got = server.request(op="setup", id=ident, case=case, variant=variant)
        self.impl, self.create_ms = got["impl"], got["create_ms"]

    def timed(self, n: int) -> float:
        return self.server.request(op="time", id=self.id, n=n)["s"]

    def output(self) -> np.ndarray:
        with tempfile.TemporaryDirectory(prefix="int8jit-bench-") as tmp:
            path = os.path.join(tmp, "out.npy")
            self.server.request(op="save", id=self.id, path=path)
            return np.load(path)


# ------------------------------------------------------------------ PyTorch side (conv)

def torch_conv_setup(case, threads: int) -> Side:
    """PyTorch's quantized conv2d + relu on ``conv_operands(case)`` (x86 engine, NHWC)."""
    try:
        import torch
    except ImportError as exc:
        raise Unavailable(f"torch unavailable ({exc})") from None
    import warnings

    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("x86", "fbgemm", "onednn") if e in engines), None)
    if engine is None:
        raise Unavailable(f"torch has no x86 quantized engine ({engines})")
    torch.backends.quantized.engine = engine
    torch.set_num_threads(threads)
    x, w, bias, wscale, dscale = conv_operands(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated in torch 2.13
        # x is NHWC: permuting to NCHW logical dims gives a channels_last tensor without a copy.
        qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), 1.0, 0).permute(0, 3, 1, 2)
        qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(w), torch.from_numpy(wscale.astype(np.float64)),
                                                      torch.zeros(case["OC"], dtype=torch.int64), 0)
        t0 = time.perf_counter()
        packed = torch.ops.quantized.conv2d_prepack(qw, torch.from_numpy(bias), [case["S"]] * 2, [case["P"]] * 2,
                                                    [1, 1], case["G"])
        create_ms = 1e3 * (time.perf_counter() - t0)
    conv, scale = torch.ops.quantized.conv2d_relu, float(dscale[0])
    out = {}

    def call():
        out["y"] = conv(qx, packed, scale, 0)

    call()
    side = Side(call, None, f"torch {torch.__version__} {engine}", create_ms)
    # The NHWC u8 output of the last call (the tensor is channels_last: the permute is a view).
    side.output = lambda: out["y"].int_repr().permute(0, 2, 3, 1).numpy()
    return side


if __name__ == "__main__" and sys.argv[1:] == ["_onednn-server"]:
    _server()
