"""pipeline: YAML grids of training settings → device-agnostic Fashion-MNIST CNN runs → MLflow."""

__version__ = "0.2.0"
