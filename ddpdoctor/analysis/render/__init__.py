"""Renderers of a :class:`~ddpdoctor.analysis.report.Report`: terminal (rich), JSON lives on the model."""
