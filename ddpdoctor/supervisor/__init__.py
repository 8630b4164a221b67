"""The supervisor side: CLI, the run pipeline, launch, monitor, transports, live display.

It never imports torch (a test proves it): it must start fast and stay responsive while ranks
hang. The one exception is the c10d store inside an existing launch (``store.connect``), where it
runs inside someone else's rank and torch is there anyway.
"""
