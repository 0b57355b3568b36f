"""ember's version: the one source (``ember.__version__``, the package metadata via pyproject.toml)."""

__version__ = "0.1.0"
