"""oneDNN's primitive C API through cffi: matmul, inner product, convolution, pooling, reorder.

The peer that int8jit's primitives are checked and timed against. Like
:mod:`tools.onednn` (whose library lookup it shares: libdnnl 3.2 from PyPI's
``onednn-cpu-gomp``), it declares only the functions it calls, written from oneDNN's
documented C API (the wheel ships no headers). The enum values below were checked
against the library itself: ``dnnl_fmt_tag2str``, ``dnnl_dt2str``,
``dnnl_alg_kind2str``, ``dnnl_prop_kind2str`` name every value we pass, and the
queries (``impl_info_str``, the ``*_md`` and memory-desc queries) were checked by
creating descriptors and reading them back (``python -m tools.onednn_prim check``
repeats those experiments; tests/test_onednn_prim.py runs them too).

Argument names are int8jit's (``primitives.attr``): ``"src"``, ``"weights"``,
``"bias"``, ``"dst"``, ``"scratchpad"``, ``"scales:src"``, ``"zero_points:dst"``,
``"post_op:1:src_1"``; :func:`arg_id` maps them to oneDNN's ``DNNL_ARG_*`` numbers.
Memory objects wrap numpy buffers without copying; a :class:`Primitive` binds them
once (:meth:`Primitive.bind`) and returns a zero-argument callable, so a timed call is
``dnnl_primitive_execute`` + ``dnnl_stream_wait`` and nothing else.

Example (oneDNN loaded in this process: cap its ISA with ``ONEDNN_MAX_CPU_ISA`` before
the first call, threads with ``OMP_NUM_THREADS``)::

    >>> import numpy as np
    >>> from tools import onednn_prim as dp
    >>> a = np.full((2, 4), 10, np.uint8); w = np.ones((4, 3), np.int8)
    >>> attr = dp.Attr(scales={"weights": 2}, post_ops=[("eltwise", "relu", 0.0, 0.0)])
    >>> p = dp.matmul(dp.md((2, 4), "u8", "ab"), dp.md((4, 3), "s8", "any"),
    ...               dp.md((2, 3), "u8", "ab"), attr=attr)
    >>> wp = p.reorder_weights(w, "ab")          # into the layout oneDNN picked
    >>> c = np.zeros((2, 3), np.uint8)
    >>> run = p.bind({"src": a, "weights": wp, "dst": c,
    ...               "scales:weights": np.float32([1, 0.5, 0.25])})
    >>> run(); c.tolist()
    [[40, 20, 10], [40, 20, 10]]
"""
from __future__ import annotations

import argparse
import sys
import time

import cffi
import numpy as np

CDEF = """
typedef int dnnl_status_t;
typedef int dnnl_data_type_t;
typedef int dnnl_format_tag_t;
typedef int dnnl_prop_kind_t;
typedef int dnnl_alg_kind_t;
typedef int dnnl_query_t;
typedef int dnnl_engine_kind_t;
typedef int dnnl_scratchpad_mode_t;
typedef int64_t dnnl_dim_t;

typedef struct dnnl_engine *dnnl_engine_t;
typedef struct dnnl_stream *dnnl_stream_t;
typedef struct dnnl_memory_desc *dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc *const_dnnl_memory_desc_t;
typedef struct dnnl_memory *dnnl_memory_t;
typedef struct dnnl_primitive_attr *dnnl_primitive_attr_t;
typedef const struct dnnl_primitive_attr *const_dnnl_primitive_attr_t;
typedef struct dnnl_post_ops *dnnl_post_ops_t;
typedef const struct dnnl_post_ops *const_dnnl_post_ops_t;
typedef struct dnnl_primitive_desc *dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc *const_dnnl_primitive_desc_t;
typedef struct dnnl_primitive *dnnl_primitive_t;
typedef const struct dnnl_primitive *const_dnnl_primitive_t;

typedef struct {
    int arg;
    dnnl_memory_t memory;
} dnnl_exec_arg_t;

dnnl_status_t dnnl_engine_create(dnnl_engine_t *engine, dnnl_engine_kind_t kind, size_t index);
dnnl_status_t dnnl_stream_create(dnnl_stream_t *stream, dnnl_engine_t engine, unsigned flags);
dnnl_status_t dnnl_stream_wait(dnnl_stream_t stream);

dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *memory_desc, int ndims,
        const dnnl_dim_t *dims, dnnl_data_type_t data_type, dnnl_format_tag_t tag);
dnnl_status_t dnnl_memory_desc_destroy(dnnl_memory_desc_t memory_desc);
dnnl_status_t dnnl_memory_desc_clone(dnnl_memory_desc_t *memory_desc,
        const_dnnl_memory_desc_t existing_memory_desc);
size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t memory_desc);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs);
dnnl_status_t dnnl_memory_desc_query(const_dnnl_memory_desc_t memory_desc, dnnl_query_t what,
        void *result);

dnnl_status_t dnnl_memory_create(dnnl_memory_t *memory, const_dnnl_memory_desc_t memory_desc,
        dnnl_engine_t engine, void *handle);
dnnl_status_t dnnl_memory_destroy(dnnl_memory_t memory);

dnnl_status_t dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr);
dnnl_status_t dnnl_primitive_attr_destroy(dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t attr,
        dnnl_scratchpad_mode_t mode);
dnnl_status_t dnnl_primitive_attr_set_scales_mask(dnnl_primitive_attr_t attr, int arg, int mask);
dnnl_status_t dnnl_primitive_attr_set_zero_points_mask(dnnl_primitive_attr_t attr, int arg, int mask);
dnnl_status_t dnnl_primitive_attr_set_post_ops(dnnl_primitive_attr_t attr,
        const_dnnl_post_ops_t post_ops);
dnnl_status_t dnnl_post_ops_create(dnnl_post_ops_t *post_ops);
dnnl_status_t dnnl_post_ops_destroy(dnnl_post_ops_t post_ops);
dnnl_status_t dnnl_post_ops_append_eltwise(dnnl_post_ops_t post_ops, dnnl_alg_kind_t alg_kind,
        float alpha, float beta);
dnnl_status_t dnnl_post_ops_append_sum(dnnl_post_ops_t post_ops, float scale, int32_t zero_point,
        dnnl_data_type_t data_type);
dnnl_status_t dnnl_post_ops_append_binary(dnnl_post_ops_t post_ops, dnnl_alg_kind_t alg_kind,
        const_dnnl_memory_desc_t src1_desc);

dnnl_status_t dnnl_matmul_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
        dnnl_engine_t engine, const_dnnl_memory_desc_t src_desc,
        const_dnnl_memory_desc_t weights_desc, const_dnnl_memory_desc_t bias_desc,
        const_dnnl_memory_desc_t dst_desc, const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_inner_product_forward_primitive_desc_create(
        dnnl_primitive_desc_t *primitive_desc, dnnl_engine_t engine, dnnl_prop_kind_t prop_kind,
        const_dnnl_memory_desc_t src_desc, const_dnnl_memory_desc_t weights_desc,
        const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_desc,
        const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_convolution_forward_primitive_desc_create(
        dnnl_primitive_desc_t *primitive_desc, dnnl_engine_t engine, dnnl_prop_kind_t prop_kind,
        dnnl_alg_kind_t alg_kind, const_dnnl_memory_desc_t src_desc,
        const_dnnl_memory_desc_t weights_desc, const_dnnl_memory_desc_t bias_desc,
        const_dnnl_memory_desc_t dst_desc, const dnnl_dim_t *strides, const dnnl_dim_t *dilates,
        const dnnl_dim_t *padding_l, const dnnl_dim_t *padding_r,
        const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_pooling_forward_primitive_desc_create(
        dnnl_primitive_desc_t *primitive_desc, dnnl_engine_t engine, dnnl_prop_kind_t prop_kind,
        dnnl_alg_kind_t alg_kind, const_dnnl_memory_desc_t src_desc,
        const_dnnl_memory_desc_t dst_desc, const dnnl_dim_t *strides, const dnnl_dim_t *kernel,
        const dnnl_dim_t *dilation, const dnnl_dim_t *padding_l, const dnnl_dim_t *padding_r,
        const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t *reorder_primitive_desc,
        const_dnnl_memory_desc_t src_desc, dnnl_engine_t src_engine,
        const_dnnl_memory_desc_t dst_desc, dnnl_engine_t dst_engine,
        const_dnnl_primitive_attr_t attr);

const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const_dnnl_primitive_desc_t primitive_desc,
        dnnl_query_t what, int index);
dnnl_status_t dnnl_primitive_desc_query(const_dnnl_primitive_desc_t primitive_desc,
        dnnl_query_t what, int index, void *result);
dnnl_status_t dnnl_primitive_desc_destroy(dnnl_primitive_desc_t primitive_desc);
dnnl_status_t dnnl_primitive_create(dnnl_primitive_t *primitive,
        const_dnnl_primitive_desc_t primitive_desc);
dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream,
        int nargs, const dnnl_exec_arg_t *args);
dnnl_status_t dnnl_primitive_destroy(dnnl_primitive_t primitive);

dnnl_status_t dnnl_set_primitive_cache_capacity(int capacity);
dnnl_status_t dnnl_get_primitive_cache_capacity(int *capacity);

const char *dnnl_fmt_tag2str(dnnl_format_tag_t v);
const char *dnnl_dt2str(dnnl_data_type_t v);
const char *dnnl_alg_kind2str(dnnl_alg_kind_t v);
const char *dnnl_prop_kind2str(dnnl_prop_kind_t v);
"""

# dnnl_data_type_t
DATA_TYPE = {"f32": 3, "s32": 4, "s8": 5, "u8": 6}
NUMPY = {"f32": np.float32, "s32": np.int32, "s8": np.int8, "u8": np.uint8}
# dnnl_format_tag_t: "any" and the plain tags (letters = logical dims in memory order).
FORMAT_TAG = {
    "undef": 0, "any": 1, "a": 2, "ab": 3, "abc": 4, "abcd": 5, "abcde": 6, "abcdef": 7,
    "ba": 14, "acb": 15, "bac": 16, "bca": 17, "cab": 18, "cba": 19,
    "abdc": 20, "acbd": 21, "acdb": 22, "adbc": 23, "adcb": 24, "bacd": 25, "bcda": 26,
    "cdab": 27, "cdba": 28, "dcab": 29,
    "abced": 30, "abdec": 31, "acbde": 32, "acdeb": 33, "adecb": 34, "bacde": 35, "bcdea": 36,
    "cdeab": 37, "cdeba": 38, "decab": 39,
}
TAG_ALIASES = {"x": "a", "nc": "ab", "cn": "ba", "oi": "ab", "io": "ba", "nchw": "abcd",
               "nhwc": "acdb", "oihw": "abcd", "hwio": "cdba", "ohwi": "acdb",
               "goihw": "abcde", "ncw": "abc", "nwc": "acb"}
PROP_FORWARD_INFERENCE = 0x60
# dnnl_alg_kind_t
ALG = {"convolution_direct": 0x1, "relu": 0x20, "tanh": 0x21, "square": 0x23, "abs": 0x24,
       "sqrt": 0x25, "linear": 0x26, "logistic": 0x29, "exp": 0x2A, "gelu_tanh": 0x2B,
       "swish": 0x2C, "clip": 0x2E, "gelu_erf": 0x31, "round": 0x32, "hardswish": 0x34,
       "pooling_max": 0x1FF, "pooling_avg_include_padding": 0x2FF,
       "pooling_avg_exclude_padding": 0x3FF, "binary_add": 0x1FFF0, "binary_mul": 0x1FFF1,
       "binary_max": 0x1FFF2, "binary_min": 0x1FFF3, "binary_div": 0x1FFF4, "binary_sub": 0x1FFF5}
# dnnl_query_t
Q_IMPL_INFO_STR = 8
Q_SRC_MD, Q_WEIGHTS_MD, Q_DST_MD, Q_SCRATCHPAD_MD = 129, 131, 133, 136
Q_NDIMS_S32, Q_DIMS, Q_DATA_TYPE, Q_FORMAT_KIND = 256, 257, 258, 262
Q_STRIDES = 14  # on a memory desc: the blocked layout's strides
FORMAT_KIND = {0: "undef", 1: "any", 2: "blocked", 4: "sparse"}
ENGINE_CPU = 1
STREAM_DEFAULT_FLAGS = 0x1  # dnnl_stream_in_order
SCRATCHPAD_MODE = {"library": 0, "user": 1}
# DNNL_ARG_*
ARG = {"src": 1, "src_1": 2, "dst": 17, "weights": 33, "bias": 41, "scratchpad": 80}
ARG_ATTR_SCALES = 4096
ARG_ATTR_ZERO_POINTS = 8192
ARG_ATTR_MULTIPLE_POST_OP_BASE = 32768  # (oneDNN 3's; 16384 is DNNL_ARG_ATTR_POST_OP_DW there)
MAX_NDIMS = 12
STATUS = {0: "success", 1: "out_of_memory", 2: "invalid_arguments", 3: "unimplemented",
          4: "last_impl_reached", 5: "runtime_error", 6: "not_required"}

ffi = cffi.FFI()
ffi.cdef(CDEF)


class OneDNNError(RuntimeError):
    """A oneDNN call returned a status other than success."""


_state: dict = {}


def available() -> tuple[bool, str]:
    """(True, where) or (False, why libdnnl cannot be used here)."""
    from tools import onednn

    return onednn.available()


def _lib():
    lib = _state.get("lib")
    if lib is None:
        from tools import onednn

        path = onednn.library_path()  # raises OSError saying what was tried
        lib = _state["lib"] = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise OneDNNError(f"{what} returned dnnl_{STATUS.get(status, status)} ({status})")


def engine():
    """The CPU engine and its in-order stream (created once per process)."""
    if "engine" not in _state:
        lib = _lib()
        eng = ffi.new("dnnl_engine_t *")
        _check(lib.dnnl_engine_create(eng, ENGINE_CPU, 0), "dnnl_engine_create")
        st = ffi.new("dnnl_stream_t *")
        _check(lib.dnnl_stream_create(st, eng[0], STREAM_DEFAULT_FLAGS), "dnnl_stream_create")
        _state["engine"], _state["stream"] = eng[0], st[0]  # live for the process
    return _state["engine"], _state["stream"]


def set_primitive_cache_capacity(n: int) -> None:
    """oneDNN's own primitive cache (0 turns it off: every creation is a cold one)."""
    _check(_lib().dnnl_set_primitive_cache_capacity(int(n)), "dnnl_set_primitive_cache_capacity")


def tag_name(tag: str) -> str:
    return TAG_ALIASES.get(tag, tag)


def arg_id(name: str | int) -> int:
    """DNNL_ARG_* of an int8jit argument name (``"scales:weights"``, ``"post_op:0:src_1"``)."""
    if isinstance(name, int):
        return name
    if name in ARG:
        return ARG[name]
    kind, _, rest = name.partition(":")
    if kind == "scales" and rest in ARG:
        return ARG_ATTR_SCALES | ARG[rest]
    if kind == "zero_points" and rest in ARG:
        return ARG_ATTR_ZERO_POINTS | ARG[rest]
    if kind == "post_op":
        index, _, arg = rest.partition(":")
        return ARG_ATTR_MULTIPLE_POST_OP_BASE * (int(index) + 1) | ARG[arg]
    raise ValueError(f"arg: no oneDNN argument for {name!r}")


# ------------------------------------------------------------------ memory descriptors

def _dims(values) -> "ffi.CData":
    values = [int(v) for v in values]
    if len(values) > MAX_NDIMS:
        raise ValueError(f"dims: at most {MAX_NDIMS} values, got {len(values)}")
    return ffi.new("dnnl_dim_t[12]", values + [0] * (MAX_NDIMS - len(values)))


class MemDesc:
    """An owned ``dnnl_memory_desc_t`` (destroyed with this object)."""

    def __init__(self, handle, owned: bool = True, keep=None):
        self.handle = handle
        self._keep = keep  # the primitive desc a borrowed md belongs to
        if owned:
            self.handle = ffi.gc(handle, _lib().dnnl_memory_desc_destroy)

    @classmethod
    def borrowed(cls, handle, owner) -> "MemDesc | None":
        return None if handle == ffi.NULL else cls(handle, owned=False, keep=owner)

    def _query_int(self, what: int) -> int:
        out = ffi.new("int *")
        _check(_lib().dnnl_memory_desc_query(self.handle, what, out), "dnnl_memory_desc_query")
        return int(out[0])

    def _query_dims(self, what: int) -> tuple:
        out = ffi.new("dnnl_dim_t **")
        _check(_lib().dnnl_memory_desc_query(self.handle, what, out), "dnnl_memory_desc_query")
        return tuple(int(out[0][i]) for i in range(self.ndims))

    @property
    def ndims(self) -> int:
        return self._query_int(Q_NDIMS_S32)

    @property
    def dims(self) -> tuple:
        return self._query_dims(Q_DIMS)

    @property
    def strides(self) -> tuple:
        """Element strides of a blocked layout (the outer strides when it has inner blocks)."""
        return self._query_dims(Q_STRIDES)

    @property
    def dt(self) -> str:
        value = self._query_int(Q_DATA_TYPE)
        return {v: k for k, v in DATA_TYPE.items()}.get(value, str(value))

    @property
    def format_kind(self) -> str:
        value = self._query_int(Q_FORMAT_KIND)
        return FORMAT_KIND.get(value, str(value))

    @property
    def size(self) -> int:
        """Bytes of a buffer holding this layout."""
        return int(_lib().dnnl_memory_desc_get_size(self.handle))

    def __eq__(self, other) -> bool:
        return isinstance(other, MemDesc) and bool(_lib().dnnl_memory_desc_equal(self.handle, other.handle))

    __hash__ = None

    def __repr__(self) -> str:
        return f"MemDesc(dims={self.dims}, dt={self.dt}, kind={self.format_kind}, size={self.size})"


def md(dims, dt: str, tag: str = "any") -> MemDesc:
    """``dnnl_memory_desc_create_with_tag``: dims in oneDNN's logical order (N, C, H, W...)."""
    if dt not in DATA_TYPE:
        raise ValueError(f"dt: expected one of {', '.join(DATA_TYPE)}, got {dt!r}")
    tag = tag_name(tag)
    if tag not in FORMAT_TAG:
        raise ValueError(f"tag: {tag!r} is not declared here ({', '.join(FORMAT_TAG)})")
    if tag not in ("any", "undef") and len(tag) != len(dims):
        raise ValueError(f"tag: {tag!r} does not fit {len(dims)} dims")
    out = ffi.new("dnnl_memory_desc_t *")
    _check(_lib().dnnl_memory_desc_create_with_tag(out, len(dims), _dims(dims), DATA_TYPE[dt],
                                                   FORMAT_TAG[tag]), "dnnl_memory_desc_create_with_tag")
    return MemDesc(out[0])


# ------------------------------------------------------------------ attributes

class Attr:
    """Primitive attributes: scales and zero-point masks, post-ops, scratchpad mode.

    ``post_ops`` entries: ``("eltwise", alg, alpha, beta)``, ``("sum", scale,
    zero_point, dt or None)`` or ``("binary", alg, MemDesc)`` (``add``, ``mul``, ``max``,
    ``min``, ``div``, ``sub``; its operand is the argument ``post_op:<i>:src_1``).
    """

    def __init__(self, scales=None, zero_points=None, post_ops=(), scratchpad_mode="library"):
        lib = _lib()
        out = ffi.new("dnnl_primitive_attr_t *")
        _check(lib.dnnl_primitive_attr_create(out), "dnnl_primitive_attr_create")
        self.handle = ffi.gc(out[0], lib.dnnl_primitive_attr_destroy)
        self.scratchpad_mode = scratchpad_mode
        _check(lib.dnnl_primitive_attr_set_scratchpad_mode(self.handle, SCRATCHPAD_MODE[scratchpad_mode]),
               "dnnl_primitive_attr_set_scratchpad_mode")
        for arg, mask in (scales or {}).items():
            _check(lib.dnnl_primitive_attr_set_scales_mask(self.handle, ARG[arg], int(mask)),
                   f"dnnl_primitive_attr_set_scales_mask({arg})")
        for arg, mask in (zero_points or {}).items():
            _check(lib.dnnl_primitive_attr_set_zero_points_mask(self.handle, ARG[arg], int(mask)),
                   f"dnnl_primitive_attr_set_zero_points_mask({arg})")
        if post_ops:
            po = ffi.new("dnnl_post_ops_t *")
            _check(lib.dnnl_post_ops_create(po), "dnnl_post_ops_create")
            po = ffi.gc(po[0], lib.dnnl_post_ops_destroy)
            for i, entry in enumerate(post_ops):
                if entry[0] == "eltwise":
                    _, alg, alpha, beta = entry
                    _check(lib.dnnl_post_ops_append_eltwise(po, ALG[alg], float(alpha), float(beta)),
                           f"post_ops[{i}]: dnnl_post_ops_append_eltwise")
                elif entry[0] == "sum":
                    _, scale, zp, dt = entry
                    _check(lib.dnnl_post_ops_append_sum(po, float(scale), int(zp), DATA_TYPE[dt] if dt else 0),
                           f"post_ops[{i}]: dnnl_post_ops_append_sum")
                elif entry[0] == "binary":
                    _, alg, src1 = entry
                    _check(lib.dnnl_post_ops_append_binary(po, ALG["binary_" + alg], src1.handle),
                           f"post_ops[{i}]: dnnl_post_ops_append_binary")
                else:
                    raise ValueError(f"post_ops[{i}]: expected 'eltwise', 'sum' or 'binary', got {entry[0]!r}")
            _check(lib.dnnl_primitive_attr_set_post_ops(self.handle, po), "dnnl_primitive_attr_set_post_ops")


def _attr_handle(attr):
    return ffi.NULL if attr is None else attr.handle


# ------------------------------------------------------------------ primitives

class Memory:
    """A ``dnnl_memory_t`` over a numpy buffer (not copied; the array is kept alive)."""

    def __init__(self, desc: MemDesc, array: np.ndarray):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("memory: expected a C-contiguous numpy array")
        if array.nbytes < desc.size:
            raise ValueError(f"memory: the array has {array.nbytes} bytes, the layout needs {desc.size}")
        lib = _lib()
        eng, _ = engine()
        out = ffi.new("dnnl_memory_t *")
        _check(lib.dnnl_memory_create(out, desc.handle, eng, ffi.cast("void *", array.ctypes.data)),
               "dnnl_memory_create")
        self.handle = ffi.gc(out[0], lib.dnnl_memory_destroy)
        self.desc, self.array = desc, array


def _vector_md(array: np.ndarray) -> MemDesc:
    dt = {np.dtype(v): k for k, v in NUMPY.items()}[array.dtype]
    return md((array.size,), dt, "a")


class Primitive:
    """A created primitive with its descriptor (queries) and creation time."""

    def __init__(self, pd_handle, what: str):
        lib = _lib()
        self.pd = ffi.gc(pd_handle, lib.dnnl_primitive_desc_destroy)
        t0 = time.perf_counter()
        out = ffi.new("dnnl_primitive_t *")
        _check(lib.dnnl_primitive_create(out, self.pd), f"dnnl_primitive_create ({what})")
        self.create_seconds = time.perf_counter() - t0
        self.handle = ffi.gc(out[0], lib.dnnl_primitive_destroy)
        self.what = what

    def query_md(self, name: str) -> MemDesc | None:
        which = {"src": Q_SRC_MD, "weights": Q_WEIGHTS_MD, "dst": Q_DST_MD,
                 "scratchpad": Q_SCRATCHPAD_MD}[name]
        return MemDesc.borrowed(_lib().dnnl_primitive_desc_query_md(self.pd, which, 0), self)

    def impl_info(self) -> str:
        out = ffi.new("const char **")
        _check(_lib().dnnl_primitive_desc_query(self.pd, Q_IMPL_INFO_STR, 0, out), "impl_info_str query")
        return ffi.string(out[0]).decode()

    def bind(self, arrays: dict):
        """Memories over ``arrays`` ({name: ndarray}); returns a zero-argument execute.

        src/weights/dst/scratchpad take the layout the descriptor reports; bias and the
        attribute arguments are 1-D (their own dims). A user-mode scratchpad is
        allocated here when not given.
        """
        lib = _lib()
        _, stream = engine()
        arrays = dict(arrays)
        sp = self.query_md("scratchpad")
        if sp is not None and sp.size and "scratchpad" not in arrays:
            arrays["scratchpad"] = np.zeros(sp.size, np.uint8)
        mems = []
        for name, array in arrays.items():
            if name in ("src", "weights", "dst", "scratchpad"):
                desc = self.query_md(name)
            else:
                desc = _vector_md(array)
            mems.append((arg_id(name), Memory(desc, array)))
        args = ffi.new("dnnl_exec_arg_t[]", len(mems))
        for i, (aid, mem) in enumerate(mems):
            args[i].arg = aid
            args[i].memory = mem.handle
        execute, wait, n, prim = lib.dnnl_primitive_execute, lib.dnnl_stream_wait, len(mems), self.handle
        keep = (mems, args, self)

        def run():
            status = execute(prim, stream, n, args)
            if status:
                _check(status, f"dnnl_primitive_execute ({self.what})")
            wait(stream)

        run.keep = keep  # the memories and arrays live as long as the callable
        return run

    def reorder_weights(self, values: np.ndarray, tag: str) -> np.ndarray:
        """``values`` (plain, in ``tag``'s memory order) reordered into the weights layout
        this primitive asked for; returns the uint8 buffer to bind as ``weights``."""
        dst = self.query_md("weights")
        return reorder_into(values, tag, dst)


def _create(fn_name: str, what: str, *args) -> Primitive:
    lib = _lib()
    out = ffi.new("dnnl_primitive_desc_t *")
    t0 = time.perf_counter()
    _check(getattr(lib, fn_name)(out, *args), f"{fn_name} ({what})")
    pd_seconds = time.perf_counter() - t0
    prim = Primitive(out[0], what)
    prim.create_seconds += pd_seconds
    return prim


def _md_or_null(m):
    return ffi.NULL if m is None else m.handle


def matmul(src: MemDesc, weights: MemDesc, dst: MemDesc, bias: MemDesc | None = None, attr=None) -> Primitive:
    eng, _ = engine()
    return _create("dnnl_matmul_primitive_desc_create", "matmul", eng, src.handle, weights.handle,
                   _md_or_null(bias), dst.handle, _attr_handle(attr))


def inner_product(src: MemDesc, weights: MemDesc, dst: MemDesc, bias: MemDesc | None = None,
                  attr=None) -> Primitive:
    eng, _ = engine()
    return _create("dnnl_inner_product_forward_primitive_desc_create", "inner_product", eng,
                   PROP_FORWARD_INFERENCE, src.handle, weights.handle, _md_or_null(bias), dst.handle,
                   _attr_handle(attr))


def convolution(src: MemDesc, weights: MemDesc, dst: MemDesc, bias: MemDesc | None = None, *,
                strides, padding_l, padding_r, dilation=None, attr=None) -> Primitive:
    """Forward-inference direct convolution. ``dilation`` is oneDNN's (0 = dense)."""
    eng, _ = engine()
    nsp = len(strides)
    dilation = [0] * nsp if dilation is None else dilation
    return _create("dnnl_convolution_forward_primitive_desc_create", "convolution", eng,
                   PROP_FORWARD_INFERENCE, ALG["convolution_direct"], src.handle, weights.handle,
                   _md_or_null(bias), dst.handle, _dims(strides), _dims(dilation), _dims(padding_l),
                   _dims(padding_r), _attr_handle(attr))


def pooling(alg: str, src: MemDesc, dst: MemDesc, *, strides, kernel, padding_l, padding_r,
            dilation=None, attr=None) -> Primitive:
    """Forward-inference pooling; ``alg`` ``max``, ``avg_include_padding`` or ``avg_exclude_padding``."""
    eng, _ = engine()
    dilation = [0] * len(kernel) if dilation is None else dilation
    return _create("dnnl_pooling_forward_primitive_desc_create", "pooling", eng, PROP_FORWARD_INFERENCE,
                   ALG["pooling_" + alg], src.handle, dst.handle, _dims(strides), _dims(kernel),
                   _dims(dilation), _dims(padding_l), _dims(padding_r), _attr_handle(attr))


def reorder(src: MemDesc, dst: MemDesc, attr=None) -> Primitive:
    eng, _ = engine()
    return _create("dnnl_reorder_primitive_desc_create", "reorder", src.handle, eng, dst.handle, eng,
                   _attr_handle(attr))


def reorder_into(values: np.ndarray, tag: str, dst: MemDesc) -> np.ndarray:
    """Plain ``values`` (logical dims of ``dst``, memory order ``tag``) into a new
    64-byte-aligned buffer in ``dst``'s layout (uint8, ``dst.size`` bytes)."""
    dt = {np.dtype(v): k for k, v in NUMPY.items()}[values.dtype]
    perm = [ord(c) - ord("a") for c in tag_name(tag)]
    dims = [0] * len(perm)
    for pos, axis in enumerate(perm):
        dims[axis] = values.shape[pos]
    values = np.ascontiguousarray(values)
    r = reorder(md(dims, dt, tag), dst)
    out = _aligned(dst.size)
    r.bind({"src": values, "dst": out})()
    return out


def _aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.zeros(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + nbytes]


def empty_like_md(desc: MemDesc, dt: str | None = None) -> np.ndarray:
    """An aligned buffer of the right byte size (uint8) for ``desc``."""
    return _aligned(desc.size)


# ------------------------------------------------------------------ experiments

def check_enums() -> list[str]:
    """Read every enum value declared here back from the library; returns the mismatches."""
    lib = _lib()
    bad = []

    def name(fn, v):
        p = fn(v)
        return None if p == ffi.NULL else ffi.string(p).decode()

    for tag, v in FORMAT_TAG.items():
        if name(lib.dnnl_fmt_tag2str, v) != tag:
            bad.append(f"format tag {tag}={v}: library says {name(lib.dnnl_fmt_tag2str, v)}")
    for dt, v in DATA_TYPE.items():
        if name(lib.dnnl_dt2str, v) != dt:
            bad.append(f"data type {dt}={v}: library says {name(lib.dnnl_dt2str, v)}")
    for alg, v in ALG.items():
        got = name(lib.dnnl_alg_kind2str, v)
        if got not in (alg, "eltwise_" + alg):
            bad.append(f"alg {alg}={v:#x}: library says {got}")
    if name(lib.dnnl_prop_kind2str, PROP_FORWARD_INFERENCE) != "forward_inference":
        bad.append("prop kind forward_inference")
    # Memory-desc queries: dims, data type, strides of a plain tag.
    m = md((2, 3, 4, 5), "u8", "acdb")
    if m.ndims != 4 or m.dims != (2, 3, 4, 5) or m.dt != "u8" or m.strides != (60, 1, 15, 3) \
            or m.format_kind != "blocked" or m.size != 120:
        bad.append(f"memory desc queries: {m}, strides {m.strides}")
    if md((2, 3), "f32", "any").format_kind != "any":
        bad.append("format kind any")
    # Primitive-desc queries: an inner product's weights md, impl string, arguments.
    p = inner_product(md((4, 8), "u8", "ab"), md((16, 8), "s8", "ab"), md((4, 16), "s32", "ab"))
    if p.query_md("weights").dims != (16, 8) or p.query_md("dst").dims != (4, 16) \
            or p.query_md("src").dt != "u8":
        bad.append("primitive desc md queries")
    if not p.impl_info():
        bad.append("impl_info_str query")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.onednn_prim", description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["check"], help="check: read the declared enum values back from libdnnl")
    ap.parse_args(argv)
    ok, why = available()
    if not ok:
        print(f"oneDNN unavailable: {why}")
        return 1
    bad = check_enums()
    for line in bad:
        print("MISMATCH", line)
    print("enum values and queries agree with the library" if not bad else f"{len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
