"""The version of qveil (pyproject.toml's ``[project] version``).

``qveil`` is a namespace package with no ``__init__``: the version lives here, and the parts
of the package are described in docs/architecture.md.
"""

__version__ = "0.1.0"
