"""Judging a sweep, as data: the comparison of its settings (`compare`), the gate that passes or fails
a candidate against a baseline, and the repeat rounds of `repeats: auto`. Renders nothing, and reads
nothing from the store: its callers read the sweeps (tracking/records.py) and hand them in.
"""
