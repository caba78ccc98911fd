"""PLACEHOLDER: replaced by the full VNNI instruction module."""
import peachpy.x86_64.isa as _isa


class _VnniExtension(_isa.Extension):
    def __init__(self, name, base):
        super().__init__(name)
        self._base = base

    @property
    def prerequisites(self):
        return tuple(self._base.prerequisites) + (self,)

    @property
    def ancestors(self):
        return (self,)


avx512_vnni = _VnniExtension("AVX512_VNNI", _isa.avx512f)
avx_vnni = _VnniExtension("AVX_VNNI", _isa.avx2)
__all__ = ["avx512_vnni", "avx_vnni"]
