"""MLflow: the one place that connects to a tracking store (`store`), logs a run (`tracker`), records
its results locally and in the store, reads sweeps back (`records`), tells live runs from dead ones,
starts the UI's server, and loads a logged model to predict. Never imports presentation.
"""
