"""The package version (one place: the package, the CLI and the report pages read it here)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
