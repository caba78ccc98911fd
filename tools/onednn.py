"""oneDNN as a peer: its int8 GEMM C API through cffi (ABI mode, no compiler).

This is the oracle and the speed reference that int8jit's GEMM is checked and timed
against. It binds the few functions it needs, declared from oneDNN's documented C API:

* ``dnnl_gemm_u8s8s32`` / ``dnnl_gemm_s8s8s32``: row-major
  ``C = alpha * (op(A) - ao) * (op(B) - bo) + beta * C + co``; ``op`` is ``'N'`` or
  ``'T'``. ``co`` follows BLAS (MKL's ``gemm_s8u8s32``): ``offsetc='F'`` one value for
  all of C; ``'C'`` a *column vector*, M values, ``C[i, j] += co[i]``; ``'R'`` a *row
  vector*, N values, ``C[i, j] += co[j]`` (measured; oneDNN reads past a shorter array);
* ``dnnl_version``, ``dnnl_get_effective_cpu_isa`` and ``dnnl_set_max_cpu_isa``.

The library comes from the PyPI wheel ``onednn-cpu-gomp`` (the ``peers`` extra), which
puts ``libdnnl.so.3`` in ``<prefix>/lib/`` rather than in site-packages; set
``INT8JIT_ONEDNN_LIB`` to use another copy. That build parallelises with GNU OpenMP:
its thread count follows ``OMP_NUM_THREADS`` or :func:`set_num_threads` (libgomp's
``omp_set_num_threads``); oneDNN 3.2 has no thread-count function of its own.

oneDNN fixes its ISA the first time it needs one, from ``ONEDNN_MAX_CPU_ISA`` (``AVX2``,
``AVX2_VNNI``, ``AVX512_CORE``, ``AVX512_CORE_VNNI``, ...: int8jit's ladder names in
upper case). To get another ISA's results, run the call in a child process:
:func:`run_in_subprocess` (one call) or :func:`run_many_in_subprocess` (a batch), which
copy the results back into the caller's arrays. Without a cap, oneDNN takes the CPU's
best, which on a CPU with AMX is ``avx512_core_amx``, not ``avx512_core_vnni``.

Example::

    >>> import numpy as np
    >>> from tools import onednn
    >>> A = np.array([[255, 255, 0, 0]], np.uint8)
    >>> B = np.array([[127], [127], [0], [0]], np.int8)
    >>> C = np.zeros((1, 1), np.int32)
    >>> co = np.zeros(1, np.int32)
    >>> onednn.gemm_u8s8s32("N", "N", "F", 1, 1, 4, 1.0, A, 4, 0, B, 1, 0, 0.0, C, 1, co)
    >>> onednn.run_in_subprocess("AVX2", "gemm_u8s8s32",
    ...     "N", "N", "F", 1, 1, 4, 1.0, A, 4, 0, B, 1, 0, 0.0, C, 1, co)
    >>> int(C[0, 0])   # 64770 on a VNNI path; AVX2 saturates the pair sum to s16
    32767

Command line: ``python -m tools.onednn [--isa ISA] [--threads N] info``.
"""
from __future__ import annotations

import argparse
import ctypes.util
import faulthandler
import functools
import importlib.metadata
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import cffi
import numpy as np

CDEF = """
typedef int64_t dnnl_dim_t;
typedef int dnnl_status_t;      /* enum: 0 is dnnl_success */
typedef int dnnl_cpu_isa_t;     /* enum, values below */
typedef struct {
    int major;
    int minor;
    int patch;
    const char *hash;
    unsigned cpu_runtime;
    unsigned gpu_runtime;
} dnnl_version_t;

const dnnl_version_t *dnnl_version(void);
dnnl_cpu_isa_t dnnl_get_effective_cpu_isa(void);
dnnl_status_t dnnl_set_max_cpu_isa(dnnl_cpu_isa_t isa);

dnnl_status_t dnnl_gemm_u8s8s32(char transa, char transb, char offsetc,
        dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, float alpha,
        const uint8_t *A, dnnl_dim_t lda, uint8_t ao,
        const int8_t *B, dnnl_dim_t ldb, int8_t bo,
        float beta, int32_t *C, dnnl_dim_t ldc, const int32_t *co);
dnnl_status_t dnnl_gemm_s8s8s32(char transa, char transb, char offsetc,
        dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, float alpha,
        const int8_t *A, dnnl_dim_t lda, int8_t ao,
        const int8_t *B, dnnl_dim_t ldb, int8_t bo,
        float beta, int32_t *C, dnnl_dim_t ldc, const int32_t *co);
"""
GOMP_CDEF = "void omp_set_num_threads(int n); int omp_get_max_threads(void);"

ENV_ISA = "ONEDNN_MAX_CPU_ISA"
ENV_LIB = "INT8JIT_ONEDNN_LIB"
# dnnl_cpu_isa_t values (dnnl_types.h, oneDNN 3.2).
CPU_ISA = {
    "default": 0x0, "sse41": 0x1, "avx": 0x3, "avx2": 0x7, "avx2_vnni": 0xF,
    "avx2_vnni_2": 0x1F, "avx512_core": 0x27, "avx512_core_vnni": 0x67,
    "avx512_core_bf16": 0xE7, "avx512_core_fp16": 0x1EF, "avx512_core_amx": 0xFEF,
    "avx512_core_amx_fp16": 0x1FEF,
}
STATUS = {
    0: "success", 1: "out_of_memory", 2: "invalid_arguments", 3: "unimplemented",
    4: "last_impl_reached", 5: "runtime_error", 6: "not_required",
}
REPO_ROOT = Path(__file__).resolve().parent.parent

ffi = cffi.FFI()
ffi.cdef(CDEF)
ffi.cdef(GOMP_CDEF)


class OneDNNError(RuntimeError):
    """A oneDNN call returned a status other than success."""


def _candidates() -> list[Path]:
    """Where libdnnl may be: the override alone where it is set (a copy that fails to load
    must not be replaced silently by another), else the wheel's own file list, <prefix>/lib."""
    paths: list[Path] = []
    if os.environ.get(ENV_LIB, "").strip():
        return [Path(os.environ[ENV_LIB].strip())]
    for dist in ("onednn-cpu-gomp", "onednn"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found = [f.locate() for f in files if f.name.startswith("libdnnl.so")]
        paths += sorted((Path(p).resolve() for p in found), key=lambda p: len(p.name))
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        paths += [Path(prefix, "lib", "libdnnl.so.3"), Path(prefix, "lib", "libdnnl.so")]
    system = ctypes.util.find_library("dnnl")
    if system:
        paths.append(Path(system))
    return paths


@functools.lru_cache(maxsize=None)
def _load():
    """(lib, libgomp or None, path) or raise OSError saying what was tried."""
    tried = []
    for path in _candidates():
        if not (path.is_file() or "/" not in str(path)):
            tried.append(f"{path} (missing)")
            continue
        try:  # never unloaded: unmapping it under idle OpenMP threads can crash at exit
            lib = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        try:  # the same libgomp that libdnnl linked (one copy per process)
            gomp = ffi.dlopen("libgomp.so.1", ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        except OSError:
            gomp = None
        return lib, gomp, path
    raise OSError(
        (f"libdnnl not loaded from {ENV_LIB}; " if os.environ.get(ENV_LIB, "").strip() else "libdnnl not found; ")
        + "install the peer with `pip install onednn-cpu-gomp==2023.2.0` "
        f"(the `peers` extra) or set {ENV_LIB}; tried: " + "; ".join(tried or ["nothing"])
    )


def available() -> tuple[bool, str]:
    """(True, where the library is) or (False, why oneDNN cannot be used here)."""
    try:
        lib, _, path = _load()
    except OSError as exc:
        return False, str(exc)
    v = lib.dnnl_version()
    if v.major < 1:
        return False, f"{path}: oneDNN {v.major}.{v.minor} is too old"
    return True, f"{path} (oneDNN {version()})"


def library_path() -> Path:
    return _load()[2]


def version() -> str:
    """``"3.2.0 (40112196)"``: major.minor.patch and the short commit hash."""
    v = _load()[0].dnnl_version()
    return f"{v.major}.{v.minor}.{v.patch} ({ffi.string(v.hash).decode()[:8]})"


def effective_isa() -> str:
    """The ISA oneDNN runs here (after the cap), as a lower-case name like ``avx2``."""
    value = _load()[0].dnnl_get_effective_cpu_isa()
    names = {v: k for k, v in CPU_ISA.items()}
    return names.get(value, hex(value))


def set_max_cpu_isa(isa: str) -> None:
    """Cap the ISA in this process; oneDNN allows it only before its first JIT kernel."""
    _check(_load()[0].dnnl_set_max_cpu_isa(CPU_ISA[isa.lower()]), "dnnl_set_max_cpu_isa")


def set_num_threads(n: int) -> None:
    """Threads for later calls (libgomp's ``omp_set_num_threads``)."""
    gomp = _load()[1]
    if gomp is None:
        raise OneDNNError("libgomp.so.1 could not be loaded; use OMP_NUM_THREADS")
    gomp.omp_set_num_threads(int(n))


def max_threads() -> int | None:
    gomp = _load()[1]
    return None if gomp is None else int(gomp.omp_get_max_threads())


def _check(status: int, what: str) -> None:
    if status != 0:
        raise OneDNNError(f"{what} returned dnnl_{STATUS.get(status, status)} ({status})")


# ---------------------------------------------------------------- numpy wrappers

def _matrix(name, arr, dtype, rows, cols, ld, *, writeable=False):
    """cffi pointer to a row-major rows x cols matrix with leading dimension ld.

    ``arr`` is either 2-D, ``rows`` rows of at least ``cols`` elements whose row stride
    is ``ld`` elements (a view of a wider array is fine), or 1-D and contiguous with at
    least ``(rows - 1) * ld + cols`` elements.
    """
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {arr.dtype}")
    if ld < max(1, cols):
        raise ValueError(f"ld{name.lower()}={ld}: must be at least {max(1, cols)}")
    item = arr.itemsize
    if arr.ndim == 2:
        ok = arr.shape[0] == rows and arr.shape[1] >= cols
        ok = ok and (arr.shape[1] <= 1 or arr.strides[1] == item)
        ok = ok and (arr.shape[0] <= 1 or arr.strides[0] == ld * item)
        if not ok:
            raise ValueError(
                f"{name}: shape {arr.shape} strides {arr.strides} is not {rows} rows of "
                f">= {cols} elements with a row stride of {ld} elements"
            )
    elif arr.ndim == 1:
        need = (rows - 1) * ld + cols if rows and cols else 0
        if not arr.flags.c_contiguous or arr.size < need:
            raise ValueError(f"{name}: 1-D array needs {need} contiguous elements, has {arr.size}")
    else:
        raise ValueError(f"{name}: expected a 1-D or 2-D array, got {arr.ndim}-D")
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{name}: array is read-only")
    ctype = {np.uint8: "uint8_t *", np.int8: "int8_t *", np.int32: "int32_t *"}[dtype]
    return ffi.cast(ctype, arr.__array_interface__["data"][0])


def prepare_gemm(kind, transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo,
                 beta, C, ldc, co):
    """Validate once and return a zero-argument callable doing one oneDNN GEMM call.

    ``kind`` is ``"u8s8"`` or ``"s8s8"`` (the type of ``A``; ``B`` is s8, ``C`` s32). The
    callable keeps the arrays alive and raises :class:`OneDNNError` on a bad status.
    """
    lib = _load()[0]
    if kind not in ("u8s8", "s8s8"):
        raise ValueError(f"kind: expected 'u8s8' or 's8s8', got {kind!r}")
    letters = {"transa": (transa, "NT"), "transb": (transb, "NT"), "offsetc": (offsetc, "FCR")}
    for arg, (value, allowed) in letters.items():
        if str(value).upper() not in allowed:
            raise ValueError(f"{arg}: expected one of {list(allowed)}, got {value!r}")
    transa, transb, offsetc = (str(x).upper() for x in (transa, transb, offsetc))
    M, N, K = (int(x) for x in (M, N, K))
    a_type = np.uint8 if kind == "u8s8" else np.int8
    a_shape = (M, K) if transa == "N" else (K, M)
    b_shape = (K, N) if transb == "N" else (N, K)
    pa = _matrix("A", A, a_type, *a_shape, int(lda))
    pb = _matrix("B", B, np.int8, *b_shape, int(ldb))
    pc = _matrix("C", C, np.int32, M, N, int(ldc), writeable=True)
    n_co = {"F": 1, "C": M, "R": N}[offsetc]  # 'C': co[i] for row i; 'R': co[j] for column j
    if not isinstance(co, np.ndarray) or co.dtype != np.int32 or co.size < n_co:
        raise ValueError(f"co: expected an int32 array of {n_co} elements for offsetc={offsetc!r}")
    co = np.ascontiguousarray(co)
    pco = ffi.cast("int32_t *", co.__array_interface__["data"][0])
    keep = (A, B, C, co)
    fn = lib.dnnl_gemm_u8s8s32 if kind == "u8s8" else lib.dnnl_gemm_s8s8s32
    name = f"dnnl_gemm_{kind}s32"
    args = (transa.encode(), transb.encode(), offsetc.encode(), M, N, K, float(alpha),
            pa, int(lda), int(ao), pb, int(ldb), int(bo), float(beta), pc, int(ldc), pco)

    def call():
        _check(fn(*args), name)
        return keep  # referencing keep ties the arrays' lifetime to the callable

    return call


def gemm_u8s8s32(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta,
                 C, ldc, co):
    """``dnnl_gemm_u8s8s32`` on numpy arrays (``A`` u8, ``B`` s8, ``C`` s32 in place)."""
    prepare_gemm("u8s8", transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo,
                 beta, C, ldc, co)()


def gemm_s8s8s32(transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo, beta,
                 C, ldc, co):
    """``dnnl_gemm_s8s8s32`` on numpy arrays (``A`` s8, ``B`` s8, ``C`` s32 in place)."""
    prepare_gemm("s8s8", transa, transb, offsetc, M, N, K, alpha, A, lda, ao, B, ldb, bo,
                 beta, C, ldc, co)()


# ---------------------------------------------------------------- child processes

def child_env(isa: str | None, threads: int | None = None) -> dict[str, str]:
    """Environment for a child that loads oneDNN capped at ``isa`` (None: no cap)."""
    env = dict(os.environ)
    env.pop(ENV_ISA, None)
    if isa is not None and isa.lower() != "default":
        env[ENV_ISA] = isa.upper()
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(int(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_many_in_subprocess(isa: str | None, calls, threads: int | None = None):
    """Run ``[(func_name, args), ...]`` of this module in one child process.

    The child loads oneDNN with ``ONEDNN_MAX_CPU_ISA=isa`` (and ``OMP_NUM_THREADS``).
    Each writeable numpy array argument gets the child's final contents copied back (so
    ``C`` is updated in place as with a direct call); arrays must be contiguous (give a
    leading dimension larger than the row as a wider 2-D or a 1-D array). Returns the
    list of return values, plus a final entry ``{"isa": ..., "version": ...}`` that says
    which ISA oneDNN actually used there.
    """
    for name, args in calls:
        if name not in _CHILD_FUNCS:
            raise ValueError(f"func_name: {name!r} is not one of {sorted(_CHILD_FUNCS)}")
        for a in args:
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                raise ValueError("arrays passed to a child process must be C-contiguous")
    with tempfile.TemporaryDirectory(prefix="int8jit-onednn-") as tmp:
        src, dst = Path(tmp, "calls.pkl"), Path(tmp, "results.pkl")
        src.write_bytes(pickle.dumps(list(calls)))
        proc = subprocess.run(
            [sys.executable, "-m", "tools.onednn", "call", str(src), str(dst)],
            env=child_env(isa, threads), cwd=REPO_ROOT, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise OneDNNError(f"oneDNN child (isa={isa}) exited with status {proc.returncode}"
                              f" (negative: killed by that signal):\n{proc.stderr.strip()}")
        results, arrays_back, info = pickle.loads(dst.read_bytes())
    for (_, args), back in zip(calls, arrays_back):
        for a, b in zip(args, back):
            if isinstance(a, np.ndarray) and a.flags.writeable and b is not None:
                np.copyto(a, b)
    return results + [info]


def run_in_subprocess(isa: str | None, func_name: str, *args, threads: int | None = None):
    """One call of ``func_name(*args)`` in a child capped at ``isa``; see above."""
    return run_many_in_subprocess(isa, [(func_name, args)], threads=threads)[0]


_CHILD_FUNCS = {
    "gemm_u8s8s32": gemm_u8s8s32,
    "gemm_s8s8s32": gemm_s8s8s32,
    "effective_isa": effective_isa,
    "version": version,
    "max_threads": max_threads,
}


def _child_call(src: str, dst: str) -> None:
    calls = pickle.loads(Path(src).read_bytes())
    results, arrays_back = [], []
    for name, args in calls:
        results.append(_CHILD_FUNCS[name](*args))
        arrays_back.append([a if isinstance(a, np.ndarray) else None for a in args])
    info = {"isa": effective_isa(), "version": version(), "threads": max_threads()}
    Path(dst).write_bytes(pickle.dumps((results, arrays_back, info)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.onednn", description=__doc__.split("\n")[0])
    ap.add_argument("--isa", help="ONEDNN_MAX_CPU_ISA for a child process (e.g. AVX2)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for that child")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="library path, version, effective ISA, threads")
    call = sub.add_parser("call", help="(internal) run pickled calls, pickle results")
    call.add_argument("src")
    call.add_argument("dst")
    ns = ap.parse_args(argv)
    if ns.isa is not None or ns.threads is not None:  # re-run with the env set before load
        args = [a for a in (argv if argv is not None else sys.argv[1:])]
        rest = args[args.index(ns.cmd):]
        return subprocess.call([sys.executable, "-m", "tools.onednn", *rest],
                               env=child_env(ns.isa, ns.threads), cwd=REPO_ROOT)
    if ns.cmd == "call":
        faulthandler.enable()  # a crash inside oneDNN names the call in stderr
        _child_call(ns.src, ns.dst)
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown while OpenMP threads may still spin
    ok, why = available()
    if not ok:
        print(f"oneDNN peer unavailable: {why}")
        return 1
    print(f"library:       {library_path()}")
    print(f"version:       {version()}")
    print(f"effective ISA: {effective_isa()} ({ENV_ISA}={os.environ.get(ENV_ISA, '<unset>')})")
    print(f"threads:       {max_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '<unset>')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
