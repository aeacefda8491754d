"""What people read: the terminal tables and sentences, the run-time report of a sweep, the charts,
the MLflow UI's view (the parent run's page) and the HTML report. Reads the analysis' results only.
"""
