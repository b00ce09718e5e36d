"""The package version, in a module of its own so that modules inside ``advisor`` can read it
without importing the package's ``__init__`` (which re-exports the Python API)."""

__version__ = "0.1.0"
