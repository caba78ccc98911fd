"""Code generation: PeachPy setup, added instructions, code pieces, templates, cache.

Importing ``jit`` does not import PeachPy; ``jit.asm`` does, on first use.
"""
