"""The PEP 517 backend setuptools projects name: `build-backend = "hatch_precompile.setuptools_backend"`.

A door kept where users' pyproject.toml points; the backend is `backend/setuptools_backend.py`.
"""

from .backend.setuptools_backend import *  # noqa: F403
from .backend.setuptools_backend import __all__ as __all__
