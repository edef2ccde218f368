"""The package version (the facade and `wai --version` read it here; pyproject.toml declares the same)."""

__version__ = "0.1.0"
