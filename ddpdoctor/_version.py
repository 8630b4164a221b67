"""ddpdoctor's version, its one place: a module that imports nothing, so every side can read it
without importing the package's public API (``ddpdoctor/__init__.py`` re-exports it)."""

__version__ = "0.2.0"
