from contracts.compiled import select as _select_build

_select_build()  # the compiled or the pure build, decided before any module of this package loads
