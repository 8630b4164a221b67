"""Built-in checks. Each module exposes ``CHECK`` and is registered as a ``ddpdoctor.checks``
entry point, the same way a third-party check is."""
