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
