"""The rank side: what runs inside the job's processes (the torchrun agent, and in every rank the
bootstrap, probes, recorder and watchdog). It must never break or change the user's script."""
