"""Put this folder on sys.path so the tests can import their helper module under --import-mode=importlib."""

import pathlib
import sys

_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
