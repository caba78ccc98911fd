"""A convolution's geometry: its shape in one 3-D form, and what follows from it alone.

How many kernel positions and K runs the batch-reduce GEMM sums over, the padded source
a copy would hold, the window rows an output row at the top or bottom edge reads
(``window_runs``), the edge strips and the cut windows of the edge columns
(``strips``, ``edge_windows``). ``primitives.conv`` builds one per descriptor;
``primitives.conv_blocking`` costs the ways of running it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """A convolution's shape in the internal 3-D form (D, H, W); 1-D and 2-D have D = H = 1 as needed."""

    n: int
    groups: int
    icg: int
    ocg: int
    src: tuple  # (D, H, W)
    ker: tuple
    out: tuple
    stride: tuple
    dil: tuple  # oneDNN's: 0 is dense
    pad_l: tuple
    pad_r: tuple
    # The source copy keeps icg channels a pixel (not padded to 4): on VNNI paths with one
    # group and W dense, where a window row's KW * icg bytes form one K run padded to 4 in
    # B alone (the stem's 3 channels: 7 * 3 = 21 of 24 multiply-adds useful, not 21 of 28).
    tight: bool = False

    @property
    def icgp(self) -> int:
        """Bytes of one group's channels in a pixel of the source copy."""
        return self.icg if self.tight else -(-self.icg // 4) * 4

    @property
    def positions(self) -> int:
        return self.ker[0] * self.ker[1] * self.ker[2]

    @property
    def padded(self) -> tuple:
        return tuple(i + a + b for i, a, b in zip(self.src, self.pad_l, self.pad_r))

    @property
    def direct(self) -> bool:
        """The user's NHWC source can be read as is (no padding, one group, channels by 4)."""
        return not any(self.pad_l + self.pad_r) and self.groups == 1 and self.icg % 4 == 0

    @property
    def flat(self) -> bool:
        """Output pixels are consecutive source pixels (1x1, stride 1): one GEMM over all of them."""
        return self.direct and self.ker == (1, 1, 1) and self.stride == (1, 1, 1)

    @property
    def k_per_position(self) -> int:
        return self.icg if self.direct else self.icgp

    @property
    def runs(self) -> tuple:
        """(count, K of each): the kernel's K runs. Dense along W with one group, a window
        row's KW pixels are KW * pixel consecutive bytes in K's packed order (kw, ic): one
        run per (kd, kh), so fewer, longer K loops; otherwise one run per position."""
        if self.dil[2] == 0 and self.groups == 1:
            return self.ker[0] * self.ker[1], self.ker[2] * self.k_per_position
        return self.positions, self.k_per_position

    @property
    def b_rows(self) -> int:
        """K of the packed weights: each run padded to a multiple of 4."""
        count, k = self.runs
        return count * -(-k // 4) * 4

    def window_runs(self, h: int) -> tuple:
        """The K runs output row ``h`` (of a plane) must read: ``(first, end)``.

        A 2-D window row that lies wholly in the top or bottom padding adds the padding
        value times its weights, which the column compensation takes away again, so rows
        there skip its K runs and their B (and take a compensation of the runs they read):
        res4's 3x3 layer (14 rows) did 2 of its 42 window rows' work for nothing, res5's
        (7 rows) 2 of 21. 3-D windows and rows with no window row inside read every run."""
        runs, kh_count = self.runs[0], self.ker[1]
        if self.ker[0] != 1 or runs % kh_count:
            return 0, runs
        per_kh = runs // kh_count  # K runs a window row (KW of them unless folded)
        step = self.dil[1] + 1
        top = h * self.stride[1] - self.pad_l[1]  # the window's first source row
        lo = next((kh for kh in range(kh_count) if top + kh * step >= 0), kh_count)
        hi = next((kh for kh in reversed(range(kh_count)) if top + kh * step < self.src[1]), -1) + 1
        return (lo * per_kh, hi * per_kh) if hi > lo else (0, runs)

    def strips(self) -> tuple | None:
        """How a padded 2-D whole-pixel source is read without a padded copy of it all:
        ``(left, right, left_width, right_width)``, or None where it cannot be.

        Output columns whose window stays inside the source's width read the user's rows
        directly (top and bottom rows skip the window rows in the padding:
        :meth:`window_runs`); the ``left`` first and ``right`` last columns, whose windows
        reach into the side padding, read two narrow padded copies of the source's edges
        instead (the strips: ``left_width`` and ``right_width`` padded columns, every
        padded row). None for 3-D windows, where an output row's window has no row inside
        the source (rows read in place skip the padding's), or where no column is inside."""
        if self.ker[0] != 1 or self.padded[0] != 1:
            return None
        step = self.dil[1] + 1
        for h in range(self.out[1]):
            top = h * self.stride[1] - self.pad_l[1]
            if not any(0 <= top + kh * step < self.src[1] for kh in range(self.ker[1])):
                return None
        extent = (self.ker[2] - 1) * (self.dil[2] + 1) + 1
        sw, width = self.stride[2], self.out[2]
        left = sum(1 for w in range(width) if w * sw < self.pad_l[2])
        right = sum(1 for w in range(width) if w * sw - self.pad_l[2] + extent > self.src[2])
        if left + right >= width:
            return None
        return (left, right, (left - 1) * sw + extent if left else 0, (right - 1) * sw + extent if right else 0)

    @property
    def run_kw(self) -> int:
        """Window columns (kw) in one K run: KW where a run folds them (Geometry.runs), else 1."""
        return self.positions // self.runs[0]

    def edge_windows(self) -> tuple | None:
        """The edge columns of :meth:`strips` as they read the source in place, their
        windows cut at the side padding: ``(w, first kw, end kw)`` per edge column, the
        window columns inside the source's width. A run (one window row, KW pixels) then
        reads its middle part: the kw in the padding are skipped in A and in B (the
        kernel's ``b_pos_skip``), as the rows at the top and bottom skip window rows
        (:meth:`window_runs`). None where runs do not fold KW (W dilated), or where an
        edge column's window lies wholly in the padding."""
        strips = self.strips()
        if strips is None or self.dil[2] or self.groups != 1:
            return None
        left, right = strips[:2]
        out = []
        for w in list(range(left)) + list(range(self.out[2] - right, self.out[2])):
            lo, hi = self.column_window(w)
            if hi <= lo:
                return None
            out.append((w, lo, hi))
        return tuple(out)

    def column_window(self, w: int) -> tuple:
        """The window columns (first kw, end kw) of output column ``w`` that lie inside the
        source's width (W not dilated; empty where the window is all padding)."""
        x0 = w * self.stride[2] - self.pad_l[2]  # the window's first source column
        lo = min(max(0, -x0), self.ker[2])  # (padding wider than the window: all of it, (KW, KW))
        return lo, max(lo, min(self.ker[2], self.src[2] - x0))

    def cut_columns(self) -> tuple:
        """The output columns whose window reaches into the side padding, as the padded
        copy's rows read them with their runs cut there: ``(w, first K group, end K
        group)`` of each K run (the kernel's ``GemmKernelSpec.cuts``). Empty where runs do
        not fold KW, or where a run's kw do not start on a K group (channels not by 4)."""
        if self.dil[2] or self.run_kw == 1 or self.k_per_position % 4:
            return ()
        per_kw = self.k_per_position // 4
        out = []
        for w in range(self.out[2]):
            lo, hi = self.column_window(w)
            if (lo, hi) != (0, self.ker[2]):
                out.append((w, lo * per_kw, hi * per_kw))
        return tuple(out)
