"""The GPU node agent: NVML readings served as watermark JSON and Prometheus metrics."""
