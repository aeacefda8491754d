"""What people read: the terminal tables and sentences, the run-time report of a sweep, the charts,
the MLflow UI's view (the parent run's page) and the HTML report. Reads the analysis' results only,
and what its callers read for it, handed in as data; never the store (sweep/publish.py writes what it
builds).
"""
