"""Argument validation shared by the primitives: every error names the argument."""
from __future__ import annotations

import numpy as np


def dtype_text(dtype) -> str:
    """A dtype's name, with its byte order when that is not the machine's.

    >>> dtype_text(np.dtype(">i4")), dtype_text(np.int32)
    ('int32 (big-endian)', 'int32')
    """
    dtype = np.dtype(dtype)
    return dtype.name + (" (big-endian)" if dtype.byteorder == ">" else "")


def check_choice(name: str, value, allowed: str):
    """One letter of ``allowed`` (case-insensitive); returns it upper-case."""
    if not isinstance(value, str) or len(value) != 1 or value.upper() not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(repr(c) for c in allowed)}, got {value!r}")
    return value.upper()


def check_dim(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_no_zero_dim(name: str, md, zero_ok: tuple[int, ...], rule: str) -> None:
    """Refuse a descriptor with a 0 in a dim outside ``zero_ok`` (the dims a primitive
    runs as a no-op when 0, as oneDNN does); ``rule`` says which those are.

    >>> from primitives.memory import desc
    >>> rule = "inner_product takes a 0 only in the batch"
    >>> check_no_zero_dim("src", desc((0, 3), "u8", "ab"), (0,), rule)
    >>> check_no_zero_dim("src", desc((2, 0), "u8", "ab"), (0,), rule)
    Traceback (most recent call last):
    ...
    ValueError: src: dimension 1 is 0 (dims (2, 0)); inner_product takes a 0 only in the batch
    """
    for i, d in enumerate(md.dims):
        if d == 0 and i not in zero_ok:
            raise ValueError(f"{name}: dimension {i} is 0 (dims {md.dims}); {rule}")


def check_int_range(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def check_matrix(name: str, array, dtype, rows: int, cols: int, ld: int, *, writable: bool = False) -> None:
    """A row-major buffer of ``rows`` rows of ``cols`` used elements, ``ld`` apart.

    Accepts a 2-D array whose rows are ``ld`` elements apart (a C-contiguous array of
    width ``ld``, or a column slice of a wider one) or a contiguous 1-D buffer; with
    ``rows`` or ``cols`` of 0, any 1-D or 2-D array of the dtype.
    """
    if not isinstance(array, np.ndarray) or isinstance(array, np.matrix):  # (a matrix's rows stay 2-D)
        raise TypeError(f"{name}: expected a numpy array (np.asarray of a matrix), got {type(array).__name__}")
    if array.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {dtype_text(array.dtype)}")
    if ld < cols:
        raise ValueError(f"ld{name.lower()}: leading dimension {ld} is smaller than the row length {cols}")
    if writable and not array.flags.writeable:
        raise ValueError(f"{name}: the array is read-only but is written to")
    item = array.itemsize
    if array.ndim not in (1, 2):
        raise ValueError(f"{name}: expected a 1-D or 2-D array, got {array.ndim} dimensions")
    if rows == 0 or cols == 0:
        return  # no element is read or written: any layout will do
    if array.ndim == 2:
        # A dimension of one element has no meaningful stride (NumPy calls B.T of a 1 x N
        # B C-contiguous, with strides (1, N)): only the strides that are walked count.
        if (array.shape[1] > 1 and array.strides[1] != item) or (rows > 1 and array.strides[0] != ld * item):
            raise ValueError(
                f"{name}: rows must be contiguous and {ld} elements apart (ld{name.lower()}={ld}); "
                f"got strides {array.strides} for itemsize {item}"
            )
        if array.shape[0] < rows or array.shape[1] < cols:
            raise ValueError(f"{name}: expected at least {rows}x{cols} elements, got shape {array.shape}")
    elif array.ndim == 1:
        if array.strides[0] != item:
            raise ValueError(f"{name}: a 1-D buffer must be contiguous, got stride {array.strides[0]}")
        need = (rows - 1) * ld + cols
        if array.size < need:
            raise ValueError(f"{name}: buffer of {array.size} elements is smaller than the {need} that "
                             f"{rows} rows of {cols} at ld {ld} need")


def check_vector(name: str, array, dtype, length: int) -> np.ndarray:
    """A 1-element-or-more vector of at least ``length`` values of ``dtype``."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(array).__name__}")
    if array.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {dtype_text(array.dtype)}")
    flat = array.reshape(-1)
    if flat.size < length:
        raise ValueError(f"{name}: expected at least {length} values, got {flat.size}")
    return flat


def check_known_dims(name: str, md) -> None:
    """Refuse a descriptor with a runtime dim (``RUNTIME_DIM``) where none is taken: only a
    matmul's src and dst take one, in M and the batch."""
    if md.runtime:
        raise ValueError(f"{name}: dims {md.verbose_str().rpartition(':')[2]} hold a runtime dim (RUNTIME_DIM); "
                         "only a matmul's src and dst take one, in M and the batch")


def check_disjoint(values, outputs: tuple[str, ...], kind: str, scratchpad=None) -> None:
    """No output among ``values`` (name -> ndarray, or Memory of one), nor a user
    ``scratchpad``, shares memory with another argument. The kernels read their inputs
    while they write the output, tile by tile: in place, a later tile would read what an
    earlier one wrote, and the result would be silently wrong (a sum post-op, or GEMM's
    beta, is the way to accumulate into it). Replays skip this: they run only on arrays
    checked before.

    >>> import numpy as np
    >>> x = np.zeros((4, 8), np.uint8)
    >>> check_disjoint({"src": x, "dst": x[2:]}, ("dst",), "matmul")
    Traceback (most recent call last):
    ...
    ValueError: dst: overlaps src; matmul does not run in place (pass an array of its own)
    """
    arrays = {name: value if isinstance(value, np.ndarray) else value.array for name, value in values.items()}
    for out in outputs:
        written = arrays.get(out)
        if written is None:
            continue
        for name, array in arrays.items():
            if name != out and np.may_share_memory(written, array):
                raise ValueError(f"{out}: overlaps {name}; {kind} does not run in place (pass an array of its own)")
    if isinstance(scratchpad, np.ndarray):
        for name, array in arrays.items():
            if np.may_share_memory(scratchpad, array):
                raise ValueError(f"scratchpad: overlaps {name}; the primitive writes its temporaries there")
