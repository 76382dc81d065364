"""Loaded by Python at start-up (``site``) when this directory is on PYTHONPATH: with
FLUXNETES_NATIVE_OPERATOR=1 it loads the operator's mypyc build made by
``bench/operator_native.py build`` (or exits with the reason: a benchmark must not measure
pure Python under the compiled label). Used only by ``bench/operator_native.py``."""

import os
import sys

if os.environ.get("FLUXNETES_NATIVE_OPERATOR") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import operator_native  # bench/operator_native.py: the module list and the cache

    status = operator_native.activate_operator_build()
    sys.path.pop(0)
    print(f"operator_native: {status.describe()}", file=sys.stderr, flush=True)
