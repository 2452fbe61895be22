"""Make every package importable from the source tree (PEP 420 namespace `deepinfer`).

Installed packages (CI installs them with pip) are found the same way; the source tree comes first so
a developer's edits are what the tests run.
"""

import pathlib
import sys

_ROOT = pathlib.Path(__file__).resolve().parent
for _src in sorted((_ROOT / "packages").glob("*/src")):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

# Test folders hold small helper modules (distinct names: ds_checks, mla_checks, dg_testing, hf_tiny); with
# --import-mode=importlib a test cannot import its neighbours, so put the folders on the path once here.
for _tests in [*sorted((_ROOT / "packages").glob("*/tests")), _ROOT / "tests" / "oracle"]:
    if str(_tests) not in sys.path:
        sys.path.append(str(_tests))
