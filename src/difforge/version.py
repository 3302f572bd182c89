"""difforge's version: a leaf module, so anything can read it without importing the package (and its API)."""

__version__ = "0.1.0"
