"""The analysis side: evidence, derived facts, the check runner, causality, the report model and
its renderers. Pure functions of the evidence: no processes, and no torch needed."""
