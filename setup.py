"""Only for `make compiled`: with MODELYARD_COMPILE=1, the request path's modules
(contracts/compiled.py lists them) are built by mypyc into extension modules beside their sources.
Without it (every plain install) this adds nothing: the package is pure Python.
"""

import os
import sys

from setuptools import setup

ext_modules = []
if os.environ.get("MODELYARD_COMPILE", "") not in ("", "0"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mypyc.build import mypycify

    from contracts.compiled import GROUP, MODULES, source_of

    # The group's shared library inside a package (contracts/request_path__mypyc.*.so), not at the top
    # level: an editable install puts our packages, not the checkout's root, on sys.path.
    ext_modules = mypycify([str(source_of(m).relative_to(os.getcwd())) for m in MODULES], opt_level="2",
                           debug_level="0", group_name=GROUP)

setup(ext_modules=ext_modules)
