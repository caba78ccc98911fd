"""Machine-facing layer: CPU probe, ISA ladder, executable memory, kernel objects, threads.

Nothing here knows about GEMM or convolution.
"""
