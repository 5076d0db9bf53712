"""Prefill/decode disaggregation: what one prefill and one decode instance sustain with wide EP and EPLB (disagg),
the search over PD shapes (search), a PD deployment in virtual time (simulate), its intervals (interval), the
plan's colocated answer beside the cheapest PD answer (versus), the --disaggregation-mode and router command lines
(launch), and the published PD runs replayed (validate)."""

from bench.model.pd import disagg, interval, launch, search, simulate, validate, versus

__all__ = ["disagg", "interval", "launch", "search", "simulate", "validate", "versus"]
