"""The tools outside ONNX Runtime's compile: vendor toolchains, SoC pruning, op probes, what Dask workers must have."""
