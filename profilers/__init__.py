"""Probes: the only package (with advisor's trainer) that touches devices.

Probes measure a :class:`profilers.workload.Workload` handed to them and never import advisor.
"""
