"""Figures from numbers: the statistics of a comparison (ratios and their intervals), the steady-state
timing summary of a run's epochs, the accuracy target and time to reach it, and whether a machine was
contended. Pure functions on numbers: no MLflow, no torch, nothing rendered.
"""
