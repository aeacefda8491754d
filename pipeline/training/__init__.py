"""One run on one device: the Fashion-MNIST data and its loaders, the training loop, the device and
its memory, energy and clocks, CUDA graphs, and the arithmetic (FLOPs) and peaks a run's MFU is read
against. Knows nothing of MLflow.
"""
